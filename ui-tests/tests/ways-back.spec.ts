import { expect, galata, test } from '@jupyterlab/galata';
import { Page } from '@playwright/test';

import { PauseHelper, SELECTORS } from './helpers';

/**
 * The ways a user comes back to a paused notebook in the browser, nothing
 * mocked: the notebook opened again, the page reloaded (the browser closed
 * and a new tab), two browser tabs pressing Resume, and Restart Kernel. Each
 * checks the chip tells the truth (a new kernel is never "live") and that
 * the data is back in the kernel the notebook uses.
 */
test.use({
  mockSettings: {
    ...galata.DEFAULT_SETTINGS,
    'jupyter-pause:plugin': { refreshIntervalSeconds: 1 }
  }
});

const BUILD =
  'model = {"name": "tiny", "weights": list(range(10))}\n' +
  'print("built", model["name"])';
const CHECK = 'print(model["name"], sum(model["weights"]))';
/** What the chip says over a kernel that does not hold the saved state. */
const OFFER =
  /^Paused — press Resume to restore model \(1 variable, .+\) into this kernel$/;
const RESTORED = /^Ready: restored from files \(1 variable\)$/;

/**
 * Build the model in a notebook and pause it from the toolbar.
 */
async function buildAndPause(
  page: Page & { notebook: any },
  pause: PauseHelper,
  tmpPath: string,
  name: string
): Promise<void> {
  await pause.openNotebook(tmpPath, name, BUILD);
  await page.notebook.runCell(0, { inplace: true });
  expect((await page.notebook.getCellTextOutput(0))?.join('')).toContain(
    'built tiny'
  );
  await expect(pause.chipLabel).toHaveText('Active');
  await pause.pause();
  await expect(pause.chipLabel).toHaveText(/^Paused since/, {
    timeout: 90 * 1000
  });
}

/**
 * Once the panel's kernel is idle, run the check in a new cell and return its
 * output.
 */
async function checkInNewCell(
  page: Page & { notebook: any },
  pause: PauseHelper
): Promise<string> {
  await pause.waitForKernelIdle();
  await page.notebook.addCell('code', CHECK);
  const index = (await page.notebook.getCellCount()) - 1;
  await page.notebook.runCell(index);
  return ((await page.notebook.getCellTextOutput(index)) ?? []).join('');
}

test.describe('every way back restores the session, and says how', () => {
  test('the notebook closed and opened again, Resume pressed 3 s later', async ({
    page,
    tmpPath
  }) => {
    const pause = new PauseHelper(page);
    await buildAndPause(page, pause, tmpPath, 'reopen.ipynb');

    await page.notebook.close();
    await page.notebook.openByPath(`${tmpPath}/reopen.ipynb`);
    await page.notebook.activate('reopen.ipynb');
    await expect(pause.chipLabel).toHaveText(OFFER, { timeout: 60 * 1000 });
    await expect(pause.chip).toHaveScreenshot('reopened-offer.png', {
      mask: [pause.chipLabel]
    });
    await page.waitForTimeout(3000); // the user reads the chip
    await expect(pause.chipLabel).toHaveText(OFFER);

    await page.locator(SELECTORS.CHIP_ACTION).click();
    await expect(pause.chipLabel).toHaveText(RESTORED, {
      timeout: 120 * 1000
    });
    expect(await checkInNewCell(page, pause)).toContain('tiny 45');
  });

  test('the browser closed while paused, then a new tab', async ({
    page,
    tmpPath
  }) => {
    const pause = new PauseHelper(page);
    await buildAndPause(page, pause, tmpPath, 'newtab.ipynb');

    // A reload is a new JupyterLab in the page: it opens the notebook again
    // (its layout is restored, so no Launcher comes up to wait for).
    await page.reload({ waitForIsReady: false });
    await page.locator('#jupyterlab-splash').waitFor({ state: 'detached' });
    await page.notebook.activate('newtab.ipynb');
    await expect(pause.chipLabel).toHaveText(OFFER, { timeout: 60 * 1000 });

    await pause.toggle.click(); // the toolbar's Resume
    await expect(pause.chipLabel).toHaveText(RESTORED, {
      timeout: 120 * 1000
    });
    expect(await checkInNewCell(page, pause)).toContain('tiny 45');
  });

  test('Restart Kernel pressed on a paused notebook, then Resume', async ({
    page,
    tmpPath
  }) => {
    const pause = new PauseHelper(page);
    await buildAndPause(page, pause, tmpPath, 'restart.ipynb');

    // The panel lets go of the kernel the pause stopped (it shows no kernel)...
    await expect
      .poll(
        () =>
          page.evaluate(() => {
            const current = (window as any).jupyterapp.shell.currentWidget;
            return current?.sessionContext?.session?.kernel?.id ?? null;
          }),
        { timeout: 30 * 1000 }
      )
      .toBeNull();
    // ...so Restart Kernel starts a new kernel, without the saved state.
    await page.evaluate(() =>
      (window as any).jupyterapp.commands.execute('notebook:restart-kernel')
    );
    await expect(pause.chipLabel).toHaveText(OFFER, { timeout: 60 * 1000 });

    await page.locator(SELECTORS.CHIP_ACTION).click();
    await expect(pause.chipLabel).toHaveText(RESTORED, {
      timeout: 120 * 1000
    });
    expect(await checkInNewCell(page, pause)).toContain('tiny 45');
  });

  test('two browser tabs on one paused notebook both press Resume', async ({
    page,
    tmpPath,
    baseURL
  }) => {
    const pause = new PauseHelper(page);
    await buildAndPause(page, pause, tmpPath, 'twotabs.ipynb');
    await page.notebook.close();
    // (Kernels of earlier tests may still run: only the ones started from here count.)
    const before = new Set(
      ((await (await page.request.get('/api/kernels')).json()) as any[]).map(
        kernel => kernel.id
      )
    );

    // Two more browser tabs open the notebook by its URL; the server makes one
    // kernel for its path.
    const url = `${baseURL}/lab/tree/${tmpPath}/twotabs.ipynb`;
    const tabs = [
      await page.context().newPage(),
      await page.context().newPage()
    ];
    await Promise.all(tabs.map(tab => tab.goto(url)));
    const labels = tabs.map(tab => tab.locator(SELECTORS.CHIP_LABEL));
    for (const label of labels) {
      await expect(label).toHaveText(OFFER, { timeout: 90 * 1000 });
    }

    await Promise.all(
      tabs.map(tab => tab.locator(SELECTORS.CHIP_ACTION).click())
    );
    for (const label of labels) {
      await expect(label).toHaveText(RESTORED, { timeout: 120 * 1000 });
    }
    const kernels = (
      (await (await page.request.get('/api/kernels')).json()) as any[]
    ).filter(kernel => !before.has(kernel.id));
    expect(kernels).toHaveLength(1);
    const timeline = await (
      await page.request.get(
        `/jupyter-pause/timeline/${tmpPath}/twotabs.ipynb`
      )
    ).json();
    const restores = timeline.events.filter(
      (event: { kind: string }) => event.kind === 'state_restored'
    );
    expect(restores).toHaveLength(1);
    expect(restores[0].data.how).toBe('files');
    await Promise.all(tabs.map(tab => tab.close()));
  });
});
