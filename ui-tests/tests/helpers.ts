import { expect, IJupyterLabPageFixture } from '@jupyterlab/galata';
import { Locator } from '@playwright/test';

/**
 * Where the jupyter-pause UI lives in the page.
 */
export enum SELECTORS {
  // The chip may move into the toolbar's overflow popup on narrow screens.
  CHIP = '.jp-JupyterPause-Chip',
  CHIP_LABEL = '.jp-JupyterPause-Chip .jp-JupyterPause-ChipLabel',
  CHIP_ACTION = '.jp-JupyterPause-Chip .jp-JupyterPause-ChipAction',
  TOGGLE = '.jp-NotebookPanel-toolbar [data-command="jupyter-pause:toggle"]',
  STATUS_ITEM = '.jp-JupyterPause-StatusItem',
  DIALOG = '.jp-Dialog',
  TIMELINE = '.jp-JupyterPause-Timeline'
}

/**
 * Small helpers over the galata page for the pause UI.
 */
export class PauseHelper {
  constructor(readonly page: IJupyterLabPageFixture) {}

  /** The status chip of the current notebook. */
  get chip(): Locator {
    return this.page.locator(SELECTORS.CHIP);
  }

  /** The text of the chip. */
  get chipLabel(): Locator {
    return this.page.locator(SELECTORS.CHIP_LABEL);
  }

  /** The pause/resume toolbar button. */
  get toggle(): Locator {
    return this.page.locator(SELECTORS.TOGGLE);
  }

  /**
   * Write a notebook (one code cell, the python3 kernelspec or `kernel`) and
   * open it.
   *
   * Created under its final name: no rename after its kernel started.
   */
  async openNotebook(
    tmpPath: string,
    name: string,
    source = '',
    kernel = { name: 'python3', display_name: 'Python 3 (ipykernel)' }
  ): Promise<void> {
    const notebook = {
      cells: [
        {
          cell_type: 'code',
          execution_count: null,
          id: 'first',
          metadata: {},
          outputs: [],
          source
        }
      ],
      metadata: {
        kernelspec: { ...kernel, language: 'python' }
      },
      nbformat: 4,
      nbformat_minor: 5
    };
    await this.page.contents.uploadContent(
      JSON.stringify(notebook),
      'text',
      `${tmpPath}/${name}`
    );
    await this.page.notebook.openByPath(`${tmpPath}/${name}`);
    await this.page.notebook.activate(name);
  }

  /**
   * Wait until the current notebook panel's kernel is idle (after a resume
   * the panel reconnects to the new kernel first).
   */
  async waitForKernelIdle(): Promise<void> {
    await expect
      .poll(
        () =>
          this.page.evaluate(() => {
            const current = (window as any).jupyterapp.shell.currentWidget;
            return current?.sessionContext?.session?.kernel?.status ?? null;
          }),
        { timeout: 60 * 1000 }
      )
      .toBe('idle');
  }

  /** Click Pause and accept the confirmation dialog. */
  async pause(): Promise<void> {
    await this.toggle.click();
    const dialog = this.page.locator(SELECTORS.DIALOG);
    await dialog.getByRole('button', { name: 'Pause notebook' }).click();
    await dialog.waitFor({ state: 'detached' });
  }
}
