import { expect, test } from '@jupyterlab/galata';

import { SELECTORS } from './helpers';

/**
 * The timeline panel from canned `timeline/<path>` answers (UTC, a fixed
 * clock): two pauses of a GPU notebook as Gantt bars, GPU hours per day, the
 * events in plain words; and a CPU-only session, which draws no GPU bars.
 * The real flow (a real pause and resume) is in pause-flow.spec.ts.
 */

/** Monday 6 January 2025, 00:00 UTC. */
const MONDAY = Date.UTC(2025, 0, 6) / 1000;
const H = 3600;

function ev(kind: string, at: number, data: Record<string, unknown> = {}) {
  return { kind, at: MONDAY + at, data };
}

const GPU_EVENTS = [
  ev('gpu_acquired', 9 * H, { gpus: [0] }),
  ev('idle_gap', 12 * H, { seconds: H }),
  ev('last_activity', 17.5 * H),
  ev('pause_requested', 18 * H, { reason: 'idle for 30 min' }),
  ev('checkpoint_written', 18 * H + 4, {
    checkpoint_id: 3,
    bytes_written: 3_100_000_000,
    bytes_total: 3_100_000_000,
    seconds: 3.6,
    skipped: { log: 'an open socket' },
    reason: 'pause'
  }),
  ev('kernel_stopped', 18 * H + 6),
  ev('gpu_released', 18 * H + 6, { measured: false, gpus: [0] }),
  ev('resume_requested', 32.9 * H),
  ev('resources_acquired', 32.9 * H + 40, { gpus: [0] }),
  ev('state_restored', 32.9 * H + 50, {
    how: 'files',
    checkpoint_id: 3,
    restored: ['model', 'optimizer', 'data', 'w'],
    failed: {}
  }),
  ev('kernel_ready', 32.9 * H + 52),
  ev('first_cell_executed', 32.9 * H + 120, { execution_count: 12 }),
  ev('last_activity', 42 * H),
  ev('pause_requested', 42.2 * H, { reason: 'user' }),
  ev('gpu_released', 42.2 * H + 5, { measured: false, gpus: [0] }),
  ev('resume_requested', 57 * H),
  ev('resources_acquired', 57 * H + 2, { gpus: [0] }),
  ev('state_restored', 57 * H + 9, {
    how: 'files',
    restored: ['model', 'optimizer', 'data', 'w'],
    failed: {}
  }),
  ev('kernel_ready', 57 * H + 10),
  ev('first_cell_executed', 57 * H + 30, { execution_count: 13 })
];

const ACCOUNTING = {
  gpus: 1,
  gpu_seconds_allocated: 62_000,
  gpu_seconds_active: 30_000,
  gpu_seconds_released: 80_000,
  pauses: 2,
  resumes: 2,
  last_resume_to_ready_seconds: 10,
  last_resume_to_next_cell_seconds: 30,
  bytes_saved: 3_100_000_000
};

const CPU_EVENTS = [
  ev('pause_requested', 10 * H, { reason: 'user' }),
  ev('checkpoint_written', 10 * H + 1, { checkpoint_id: 1, bytes_written: 2e6 }),
  ev('kernel_stopped', 10 * H + 2),
  ev('resume_requested', 11 * H),
  ev('resources_acquired', 11 * H + 1, { gpus: [] }),
  ev('state_restored', 11 * H + 3, {
    how: 'files',
    restored: ['df'],
    failed: {}
  }),
  ev('kernel_ready', 11 * H + 3),
  ev('first_cell_executed', 11 * H + 20)
];

for (const [name, events, accounting] of [
  ['gpu', GPU_EVENTS, ACCOUNTING],
  [
    'cpu',
    CPU_EVENTS,
    {
      ...ACCOUNTING,
      gpus: 0,
      gpu_seconds_allocated: 0,
      gpu_seconds_active: 0,
      gpu_seconds_released: 0,
      pauses: 1,
      resumes: 1
    }
  ]
] as const) {
  test(`timeline panel: ${name} session`, async ({ page }) => {
    await page.clock.setFixedTime(new Date((MONDAY + 58 * H) * 1000));
    const path = `${name}-timeline.ipynb`;
    await page.route(/\/jupyter-pause\/timeline\//, route =>
      route.fulfill({
        status: 200,
        contentType: 'application/json',
        body: JSON.stringify({ path, state: 'ready', events, accounting })
      })
    );
    await page.evaluate(
      p =>
        (window as any).jupyterapp.commands.execute('jupyter-pause:timeline', {
          path: p
        }),
      path
    );
    const panel = page.locator(SELECTORS.TIMELINE);
    await expect(panel).toContainText('Events');
    // plain words, one line per timestamp, no raw JSON
    await expect(panel).toContainText('Restored from files:');
    await expect(panel.locator('.jp-JupyterPause-TimelineEvents')).not.toContainText(
      '{'
    );
    for (const when of await panel.locator('.jp-JupyterPause-TimelineWhen').all()) {
      const box = await when.boundingBox();
      expect(box!.height).toBeLessThan(24);
    }
    if (name === 'gpu') {
      await expect(panel.locator('.jp-JupyterPause-Phase-released')).toHaveCount(3);
      await expect(panel).toContainText('GPU hours per day, last 21 days');
    } else {
      await expect(panel).toContainText('none (CPU-only session)');
      await expect(panel).not.toContainText('GPU hours per day');
      await expect(panel.locator('.jp-JupyterPause-BarAllocated')).toHaveCount(0);
    }
    await expect(panel).toHaveScreenshot(`timeline-${name}.png`);
  });
}
