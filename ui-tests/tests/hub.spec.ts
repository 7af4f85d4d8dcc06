import { expect, galata, IJupyterLabPageFixture } from '@jupyterlab/galata';
import { Page, test } from '@playwright/test';

import { PauseHelper, SELECTORS } from './helpers';

/**
 * Through a real JupyterHub (playwright-hub.config.js starts
 * tests/hub_lab.py: the shipped deploy/jupyterhub/jupyterhub_config.py in its
 * demo mode): log in, run a cell, Pause, the Hub shows the server stopped,
 * start it again, Resume, the value is back. Plain Playwright for the Hub's
 * pages; galata's helpers once JupyterLab runs under /user/<name>/.
 */

const USER = 'ada';
const PASSWORD = process.env.JUPYTER_PAUSE_HUB_PASSWORD || 'pause-ui-tests';
const NOTEBOOK = 'demo.ipynb';

/**
 * JupyterLab is up: its plugins started, galata's in-page helpers there (the
 * Hub's config adds them to each user's server), the splash screen gone.
 */
async function waitForLab(page: Page): Promise<void> {
  await page.waitForFunction(
    async () => {
      const app = (window as any).jupyterapp;
      if (
        typeof app !== 'object' ||
        typeof (window as any).galata !== 'object'
      ) {
        return false;
      }
      await app.started;
      return true;
    },
    undefined,
    { timeout: 120 * 1000 }
  );
  await page.locator('#jupyterlab-splash').waitFor({ state: 'detached' });
}

/**
 * The user's JupyterLab the Hub's redirect opened (after the login or a
 * start), with galata's helpers, and the notebook open and active.
 */
async function openNotebook(
  page: Page,
  baseURL: string
): Promise<IJupyterLabPageFixture> {
  await page.waitForURL(`**/user/${USER}/lab**`, { timeout: 120 * 1000 });
  await waitForLab(page);
  const lab = galata.addHelpersToPage(
    page,
    `${baseURL}/user/${USER}`,
    waitForLab,
    '/lab'
  );
  await lab.notebook.openByPath(NOTEBOOK);
  await lab.notebook.activate(NOTEBOOK);
  return lab;
}

test('through the Hub: pause gives the server back, a new one restores the value', async ({
  page,
  baseURL
}) => {
  // Given a user logged in to the Hub, whose notebook set x
  await page.goto('/hub/login');
  await page.locator('#username_input').fill(USER);
  await page.locator('#password_input').fill(PASSWORD);
  await page.getByRole('button', { name: 'Sign in' }).click();
  let lab = await openNotebook(page, baseURL!);
  let pause = new PauseHelper(lab);
  await pause.waitForKernelIdle();
  await lab.notebook.runCell(0, { inplace: true });
  expect((await lab.notebook.getCellTextOutput(0))?.join('').trim()).toBe('42');
  await lab.notebook.save();
  await expect(pause.chipLabel).toHaveText('Active');
  // whose chip says what a pause does here
  await expect(pause.chip).toHaveAttribute(
    'title',
    /A pause here: the Hub stops this server and its GPU goes back/
  );

  // When it is paused from the toolbar
  await pause.pause();

  // Then JupyterLab says its server is gone
  const lost = page.locator(SELECTORS.DIALOG);
  await expect(lost).toContainText('Server unavailable or unreachable', {
    timeout: 90 * 1000
  });
  await expect(lost).toContainText(
    `Your server at /user/${USER}/ is not running`
  );
  // and the chip says the server stopped, not that it is still saving: once
  // the server is gone, the Hub answers the chip's polls itself (HTTP 424)
  await expect(pause.chip).not.toHaveClass(/jp-JupyterPause-Chip-busy/);
  await expect(pause.chipLabel).toHaveText('Server stopped');

  // and the Hub shows the server stopped (its home page, once the stop is done)
  const start = page.locator('#start');
  await expect(async () => {
    await page.goto('/hub/home');
    await expect(start).toHaveText(/^\s*Start\s+My Server\s*$/, {
      timeout: 1000
    });
    await expect(page.locator('#stop')).toHaveCount(0, { timeout: 1000 });
  }).toPass({ intervals: [500], timeout: 60 * 1000 });

  // When the user starts it again and opens the notebook
  await start.click();
  lab = await openNotebook(page, baseURL!);
  pause = new PauseHelper(lab);

  // Then it shows Paused, with what was saved: JupyterLab started a new kernel
  // for the notebook, and Resume restores x into it
  await pause.waitForKernelIdle();
  await expect(pause.chipLabel).toHaveText(
    /^Paused — press Resume to restore x \(1 variable, [\d.]+ [KMG]?B\) into this kernel$/,
    { timeout: 60 * 1000 }
  );

  // When it is resumed
  await pause.toggle.click();

  // Then it is restored from files, and x is back
  await expect(pause.chipLabel).toHaveText(
    'Ready: restored from files (1 variable)',
    { timeout: 120 * 1000 }
  );
  await pause.waitForKernelIdle();
  await lab.notebook.addCell('code', 'print(x)');
  await lab.notebook.runCell(1);
  expect((await lab.notebook.getCellTextOutput(1))?.join('').trim()).toBe('42');

  // and its timeline spans the stop
  await page.evaluate(() =>
    (window as any).jupyterapp.commands.execute('jupyter-pause:timeline')
  );
  const timeline = page.locator(SELECTORS.TIMELINE);
  await expect(timeline).toContainText('Pause requested (user)');
  await expect(timeline).toContainText(
    /Server started again \(paused at \d\d:\d\d; the server was stopped, \d+ s after its start was requested\)/
  );
  await expect(timeline).toContainText('Restored from files: 1 variable (x)');
});
