import { expect, galata, test } from '@jupyterlab/galata';

import { PauseHelper, SELECTORS } from './helpers';

/**
 * Every state the chip can show, from canned `sessions/<path>` answers: the
 * states a real run cannot reach deterministically (waiting for a GPU, a
 * failed resume, progress percentages). The real flow is in pause-flow.spec.ts.
 */
test.use({
  mockSettings: {
    ...galata.DEFAULT_SETTINGS,
    'jupyter-pause:plugin': { refreshIntervalSeconds: 1 }
  }
});

/** 18:02 UTC (the tests run with timezoneId UTC). */
const SINCE = Date.UTC(2025, 0, 2, 18, 2, 0) / 1000;

const BASE = {
  key: '/tmp/gallery.ipynb',
  message: '',
  since: SINCE,
  kernel_id: null,
  kernel_name: 'python3',
  gpus: [0],
  gpus_needed: 1,
  progress: null,
  how: null,
  restore: null,
  error: null,
  checkpoint: null,
  queue_position: null,
  paused_during_cell: null,
  busy: false,
  busy_since: null,
  execution_count: 1,
  last_activity: null,
  watching: true
};

const RESTORE = {
  checkpoint_id: '3',
  restored: Array.from({ length: 12 }, (_, i) => `v${i}`),
  failed: { conn: 'open socket' },
  not_saved: { fh: 'open socket' },
  warnings: [],
  seconds: 2.4,
  bytes_read: 3_100_000_000
};

/** A restore that missed a variable and the imports: retention is held. */
const PARTIAL = {
  state: 'partial',
  how: 'files',
  restore: { ...RESTORE, failed: { data: 'the data file is damaged' } },
  message:
    'Restored partially from files (12 variables; 2 not restored: data (the data file is damaged), import scratch (No module named scratch)).',
  error: {
    what: 'checkpoint 3 holds what was not restored',
    recovery:
      'No checkpoint of this notebook is deleted until you decide. Fix the cause, then bring the data back in the notebook with `%checkpoint restore 3`; once it is back, or to carry on without it, run `jupyter pause accept gallery.ipynb` (or Accept in JupyterLab).'
  },
  hold: {
    checkpoints: {
      '3': {
        failed: {
          data: 'the data file is damaged',
          'import scratch': 'No module named scratch'
        },
        since: SINCE
      }
    }
  }
};

const STATES: [string, Record<string, unknown>, RegExp | string][] = [
  ['active', { state: 'active' }, 'Active'],
  [
    'checkpointing',
    {
      state: 'checkpointing',
      progress: { phase: 'writing', done: 42, total: 100 }
    },
    'Checkpointing 42%'
  ],
  ['pausing', { state: 'pausing' }, 'Pausing'],
  [
    'paused',
    {
      state: 'paused',
      checkpoint: { id: '3', created: SINCE, bytes: 3_100_000_000 }
    },
    'Paused since 18:02 (3.1 GB saved)'
  ],
  [
    'waiting',
    {
      state: 'waiting-for-resources',
      queue_position: 1,
      message:
        'Waiting for a GPU: all 1 GPU(s) are in use (by train.ipynb); you are number 1 in the queue'
    },
    'Waiting for GPU (all 1 GPU(s) are in use (by train.ipynb))'
  ],
  [
    'restoring',
    {
      state: 'restoring',
      progress: { phase: 'reading', done: 63, total: 100 }
    },
    'Restoring 63%'
  ],
  ['ready-live', { state: 'ready', how: 'live' }, 'Ready: live session restored'],
  [
    'ready-files',
    { state: 'ready', how: 'files', restore: RESTORE },
    'Ready: restored from files (12 variables; 2 skipped, open socket)'
  ],
  ['partial', PARTIAL, 'Restored partially (2 missing)'],
  [
    'failed',
    {
      state: 'failed',
      error: {
        what: 'resume failed: could not start a python3 kernel',
        recovery: 'The checkpoint is intact. Resume again to restore from files.'
      }
    },
    'Failed: could not start a python3 kernel'
  ]
];

test('chip gallery: every state', async ({ page }) => {
  const pause = new PauseHelper(page);
  let answer: Record<string, unknown> = { ...BASE, state: 'active' };
  await page.route(/\/jupyter-pause\/sessions\//, route =>
    route.fulfill({
      status: 200,
      contentType: 'application/json',
      body: JSON.stringify({ ...answer, path: 'gallery.ipynb' })
    })
  );
  // No kernel: nothing here holds the (single) GPU of the test server.
  await page.notebook.createNew('gallery.ipynb', { kernel: null });

  for (const [name, fields, label] of STATES) {
    answer = { ...BASE, ...fields };
    await expect(pause.chipLabel).toHaveText(label);
    await expect(pause.chip).toHaveScreenshot(`chip-${name}.png`);
  }
  // A failed resume offers "Restore from files", which calls resume.
  await expect(page.locator(SELECTORS.CHIP_ACTION)).toHaveText(
    'Restore from files'
  );
  const resumed = page.waitForRequest(
    request =>
      request.method() === 'POST' &&
      request.url().includes('/jupyter-pause/resume/')
  );
  await page.route(/\/jupyter-pause\/resume\//, route =>
    route.fulfill({
      status: 202,
      contentType: 'application/json',
      body: JSON.stringify({ ...BASE, state: 'resuming' })
    })
  );
  // The server answers the state it is in from then on (the chip polls every second after
  // a resume: a "failed" answer there would flip the chip back before its screenshot).
  answer = { ...BASE, state: 'resuming' };
  await page.locator(SELECTORS.CHIP_ACTION).click();
  await resumed;
  await expect(pause.chipLabel).toHaveText('Resuming');
  await expect(pause.chip).toHaveScreenshot('chip-resuming.png');
});

test('partial restore: Accept lets retention run again', async ({ page }) => {
  const pause = new PauseHelper(page);
  let answer: Record<string, unknown> = { ...BASE, ...PARTIAL };
  await page.route(/\/jupyter-pause\/sessions\//, route =>
    route.fulfill({
      status: 200,
      contentType: 'application/json',
      body: JSON.stringify({ ...answer, path: 'partial.ipynb' })
    })
  );
  await page.notebook.createNew('partial.ipynb', { kernel: null });
  await expect(pause.chipLabel).toHaveText('Restored partially (2 missing)');
  await expect(page.locator(SELECTORS.CHIP_ACTION)).toHaveText('Accept');

  const accepted = page.waitForRequest(
    request =>
      request.method() === 'POST' &&
      request.url().includes('/jupyter-pause/accept/')
  );
  await page.route(/\/jupyter-pause\/accept\//, route => {
    answer = { ...BASE, state: 'ready', how: 'files', restore: RESTORE };
    return route.fulfill({
      status: 200,
      contentType: 'application/json',
      body: JSON.stringify({ ...answer, path: 'partial.ipynb' })
    });
  });
  await page.locator(SELECTORS.CHIP_ACTION).click();
  await accepted;
  await expect(pause.chipLabel).toHaveText(
    'Ready: restored from files (12 variables; 2 skipped, open socket)'
  );
});

test('server extension missing: the chip says so, commands disabled', async ({
  page
}) => {
  const pause = new PauseHelper(page);
  // The REST API only: the extension's own files live below /lab/extensions/.
  await page.route(/^https?:\/\/[^/]+\/jupyter-pause\//, route =>
    route.fulfill({ status: 404, body: '' })
  );
  await page.goto();
  await page.notebook.createNew('missing.ipynb', { kernel: null });
  await expect(pause.chipLabel).toHaveText('Pause unavailable');
  await expect(pause.toggle).toHaveAttribute('title', /unavailable/);
  await expect(pause.toggle).toHaveAttribute('aria-disabled', 'true');
  await expect(pause.chip).toHaveScreenshot('chip-missing.png');
});

test('waiting for a GPU: Restore on CPU now asks for no accelerators, Cancel cancels', async ({
  page
}) => {
  const pause = new PauseHelper(page);
  const waiting = {
    ...BASE,
    state: 'waiting-for-resources',
    queue_position: 2,
    message:
      'Waiting for a GPU: 2nd in line; 1 resume on this server gets a GPU first'
  };
  let answer: Record<string, unknown> = waiting;
  await page.route(/\/jupyter-pause\/sessions\//, route =>
    route.fulfill({
      status: 200,
      contentType: 'application/json',
      body: JSON.stringify({ ...answer, path: 'waiting.ipynb' })
    })
  );
  const bodies: Record<string, string | null> = {};
  await page.route(/\/jupyter-pause\/(resume|cancel)\//, route => {
    const request = route.request();
    const action = request.url().includes('/cancel/') ? 'cancel' : 'resume';
    bodies[action] = request.postData();
    answer =
      action === 'cancel'
        ? { ...BASE, state: 'paused', message: 'Resume cancelled; still paused.' }
        : { ...BASE, state: 'resuming', gpus: [] };
    return route.fulfill({
      status: action === 'cancel' ? 200 : 202,
      contentType: 'application/json',
      body: JSON.stringify({ ...answer, path: 'waiting.ipynb' })
    });
  });
  // No kernel: nothing here holds the (single) GPU of the test server.
  await page.notebook.createNew('waiting.ipynb', { kernel: null });
  await expect(pause.chipLabel).toHaveText('Waiting for GPU (2nd in line)');
  // The test server's backend (local) restores on CPU: both buttons.
  const buttons = page.locator(SELECTORS.CHIP_ACTION);
  await expect(buttons).toHaveText(['Restore on CPU now', 'Cancel']);

  await buttons.filter({ hasText: 'Cancel' }).click();
  await expect(pause.chipLabel).toHaveText(/^Paused since/);
  expect(bodies.cancel ?? '').toBe('');
  await expect(buttons).toHaveCount(0);

  answer = waiting;
  await expect(pause.chipLabel).toHaveText('Waiting for GPU (2nd in line)');
  await buttons.filter({ hasText: 'Restore on CPU now' }).click();
  await expect(pause.chipLabel).toHaveText('Resuming');
  expect(JSON.parse(bodies.resume ?? '{}')).toEqual({ accelerators: 'none' });
});
