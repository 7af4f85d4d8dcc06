import { readFile } from 'fs/promises';

import { expect, galata, test } from '@jupyterlab/galata';

import { PauseHelper, SELECTORS } from './helpers';

/**
 * Take the session with you (issue 39), nothing mocked: Export Session…
 * downloads a notebook with its saved state as one file, Import Session…
 * brings that file back as a new notebook, paused and untrusted, and its
 * Resume asks for trust before any of it is restored.
 */
test.use({
  mockSettings: {
    ...galata.DEFAULT_SETTINGS,
    'jupyter-pause:plugin': { refreshIntervalSeconds: 1 }
  }
});

/** What the chip says of an import not trusted yet. */
const IMPORTED = /^Paused \(imported from .+ on .+\)$/;

test.describe('session files', () => {
  test('exported, imported under a new name, trusted and resumed', async ({
    page,
    tmpPath
  }, testInfo) => {
    const pause = new PauseHelper(page);
    await pause.openNotebook(tmpPath, 'travel.ipynb', 'x = 42');
    await page.notebook.runCell(0, { inplace: true });
    await expect(pause.chipLabel).toHaveText('Active');

    // Export Session…: the running kernel is checkpointed, the file downloaded.
    const downloading = page.waitForEvent('download');
    await page.evaluate(() =>
      (window as any).jupyterapp.commands.execute(
        'jupyter-pause:export-session'
      )
    );
    const download = await downloading;
    expect(download.suggestedFilename()).toBe('travel.jpsession');
    // (Read before the toast closes itself, 5 s on.)
    await expect(
      page.locator('.Toastify__toast').filter({ hasText: 'Exported' })
    ).toContainText(/Exported travel\.jpsession \(checkpoint \d+, .+\)/);
    await expect(
      page.locator('.Toastify__toast').filter({ hasText: 'Exporting' })
    ).toHaveCount(0);
    const file = testInfo.outputPath('travel.jpsession');
    await download.saveAs(file);

    // The source notebook goes, with its kernel (and the one GPU it holds).
    await page.notebook.close();
    await page.kernel.shutdownAll();

    // Import Session…: pick the file, name the new notebook.
    const choosing = page.waitForEvent('filechooser');
    void page.evaluate(() => {
      void (window as any).jupyterapp.commands.execute(
        'jupyter-pause:import-session'
      );
    });
    const chooser = await choosing;
    expect(await chooser.element().getAttribute('accept')).toBe('.jpsession');
    await chooser.setFiles(file);
    const dialog = page.locator(SELECTORS.DIALOG);
    const input = dialog.locator('input');
    await expect(input).toHaveValue(/travel\.ipynb$/);
    await input.fill(`${tmpPath}/arrived.ipynb`);
    await dialog.getByRole('button', { name: 'Import' }).click();
    await dialog.waitFor({ state: 'detached' });

    // The new notebook opens, paused, and says where it came from.
    await expect(page.locator('.jp-NotebookPanel-toolbar')).toBeVisible();
    await expect
      .poll(() =>
        page.evaluate(
          () => (window as any).jupyterapp.shell.currentWidget?.context?.path
        )
      )
      .toBe(`${tmpPath}/arrived.ipynb`);
    await expect(pause.chipLabel).toHaveText(IMPORTED, { timeout: 60 * 1000 });
    await expect(pause.toggle).toHaveAttribute('title', /^Resume/);
    // (No screenshot: the chip's width follows the user and host names.)
    await expect(pause.chip).toHaveAttribute('data-tone', 'warning');
    await expect(pause.chip).toHaveAttribute(
      'title',
      /Restoring it runs code from the file: Resume asks you to trust it first\./
    );

    // Resume asks first: who made it, where, when, and that restoring runs code.
    await pause.toggle.click();
    const trust = page.locator(SELECTORS.DIALOG);
    await expect(trust).toContainText('Trust this imported session?');
    await expect(trust).toContainText(
      /It was made by .+ on .+, on \d{4}-\d\d-\d\d \d\d:\d\d/
    );
    await expect(trust).toContainText('Restoring it runs code from the file');
    await trust.getByRole('button', { name: 'Trust and Resume' }).click();
    await trust.waitFor({ state: 'detached' });

    await expect(pause.chipLabel).toHaveText(
      /^Ready: restored from files \(1 variable\)$/,
      { timeout: 120 * 1000 }
    );
    await pause.waitForKernelIdle();
    await page.notebook.addCell('code', 'print(x)');
    await page.notebook.runCell(1);
    expect((await page.notebook.getCellTextOutput(1))?.join('')).toContain(
      '42'
    );

    // The same file dropped on the file browser is imported, not uploaded.
    await page.notebook.close();
    const dataTransfer = await page.evaluateHandle(base64 => {
      const bytes = Uint8Array.from(atob(base64), c => c.charCodeAt(0));
      const transfer = new DataTransfer();
      transfer.items.add(new File([bytes], 'travel.jpsession'));
      return transfer;
    }, (await readFile(file)).toString('base64'));
    await page
      .locator('#filebrowser .jp-DirListing-content')
      .dispatchEvent('drop', { dataTransfer });
    const dropped = page.locator(SELECTORS.DIALOG);
    await expect(dropped.locator('input')).toHaveValue(/travel\.ipynb$/);
    await dropped.locator('input').fill(`${tmpPath}/dropped.ipynb`);
    await dropped.getByRole('button', { name: 'Import' }).click();
    await expect
      .poll(() =>
        page.evaluate(
          () => (window as any).jupyterapp.shell.currentWidget?.context?.path
        )
      )
      .toBe(`${tmpPath}/dropped.ipynb`);
    await expect(pause.chipLabel).toHaveText(IMPORTED, { timeout: 60 * 1000 });
    expect(await page.contents.fileExists(`${tmpPath}/travel.jpsession`)).toBe(false);
    // The kernels this test started go with it.
    await page.notebook.close();
    await page.kernel.shutdownAll();
  });
});
