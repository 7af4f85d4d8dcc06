import { expect, test } from '@jupyterlab/galata';

import { PauseHelper, SELECTORS } from './helpers';

/**
 * The real flow, nothing mocked: build a model, pause (the kernel stops and
 * its state goes to disk), resume from files, use the model again.
 */
test.describe('pause and resume a notebook', () => {
  test('Paused, then restored from files with the model intact', async ({
    page,
    tmpPath
  }) => {
    const pause = new PauseHelper(page);
    await pause.openNotebook(
      tmpPath,
      'flow.ipynb',
      'import numpy as np\n' +
        'model = {"name": "tiny", "weights": np.arange(10.0)}\n' +
        'print("built", model["name"])'
    );
    await page.notebook.runCell(0, { inplace: true });
    expect((await page.notebook.getCellTextOutput(0))?.join('')).toContain(
      'built tiny'
    );

    await expect(pause.chipLabel).toHaveText('Active');
    await expect(pause.toggle).toHaveAttribute('title', /^Pause/);
    await expect(pause.chip).toHaveScreenshot('flow-active.png');
    await expect(page.locator(SELECTORS.STATUS_ITEM)).toContainText(
      'Pause: Active'
    );

    await pause.pause();
    await expect(pause.chipLabel).toHaveText(
      /^Paused since \d\d:\d\d \(.+ saved\)$/,
      { timeout: 90 * 1000 }
    );
    await expect(pause.toggle).toHaveAttribute('title', /^Resume/);
    await expect(pause.chip).toHaveScreenshot('flow-paused.png', {
      mask: [pause.chipLabel]
    });

    await pause.toggle.click();
    await expect(pause.chipLabel).toHaveText(
      /^Ready: restored from files \(\d+ variables?/,
      { timeout: 120 * 1000 }
    );
    await expect(pause.chipLabel).toContainText('Ready: restored from files');

    // The panel is connected to the new kernel: the model is there.
    await pause.waitForKernelIdle();
    await page.notebook.addCell(
      'code',
      'print(model["name"], float(model["weights"].sum()))'
    );
    await page.notebook.runCell(1);
    expect((await page.notebook.getCellTextOutput(1))?.join('')).toContain(
      'tiny 45.0'
    );
    await expect(pause.chip).toHaveScreenshot('flow-ready-files.png');

    await page.notebook.save();

    // The timeline panel: the pause and the resume, charted and listed.
    await page.evaluate(() =>
      (window as any).jupyterapp.commands.execute('jupyter-pause:timeline')
    );
    const timeline = page.locator(SELECTORS.TIMELINE);
    await expect(timeline).toContainText('Pause requested');
    await expect(timeline).toContainText('First cell run after the resume');
    await expect(timeline).toContainText('Admin policy (read-only)');
    await expect(timeline.locator('svg rect').first()).toBeVisible();
  });
});
