import { ITimelineEvent } from '../api';
import { describeEvent, gpuDays, pauseBars, usesGpus } from '../phases';

function ev(kind: string, at: number, data = {}): ITimelineEvent {
  return { kind, at, data };
}

/** Local midnight of Monday 6 January 2025 (days are the browser's). */
const MONDAY = new Date(2025, 0, 6).getTime() / 1000;
const H = 3600;

describe('pauseBars', () => {
  it('splits each pause into its phases, from active work to the first cell', () => {
    const events = [
      ev('gpu_acquired', 0, { gpus: [0] }),
      ev('last_activity', 600),
      ev('pause_requested', 1000),
      ev('checkpoint_written', 1005, { bytes_written: 10 }),
      ev('kernel_stopped', 1010),
      ev('gpu_released', 1010),
      ev('resume_requested', 5000),
      ev('resources_acquired', 5002),
      ev('state_restored', 5008),
      ev('kernel_ready', 5010),
      ev('first_cell_executed', 5030),
      ev('last_activity', 5100),
      ev('pause_requested', 6000),
      ev('gpu_released', 6010)
    ];
    const bars = pauseBars(events, 7000);
    expect(bars.map(b => b.index)).toEqual([1, 2]);
    expect(bars[0].phases).toEqual([
      { kind: 'active', start: 0, end: 600 },
      { kind: 'idle', start: 600, end: 1000 },
      { kind: 'checkpointing', start: 1000, end: 1010 },
      { kind: 'released', start: 1010, end: 5000 },
      { kind: 'waiting', start: 5000, end: 5002 },
      { kind: 'restoring', start: 5002, end: 5010 },
      { kind: 'ready', start: 5010, end: 5030 }
    ]);
    // the second pause: work from the first cell on; still released now
    expect(bars[1].phases).toEqual([
      { kind: 'active', start: 5030, end: 5100 },
      { kind: 'idle', start: 5100, end: 6000 },
      { kind: 'checkpointing', start: 6000, end: 6010 },
      { kind: 'released', start: 6010, end: 7000 }
    ]);
  });

  it('has no bar without a pause', () => {
    expect(pauseBars([ev('gpu_acquired', 0)], 10)).toEqual([]);
  });
});

describe('gpuDays', () => {
  it('splits held and idle time at local midnight: allocated vs active', () => {
    // Held from Monday 20:00 to Tuesday 04:00 (8 h), idle from 22:00 to 03:00
    const events = [
      ev('gpu_acquired', MONDAY + 20 * H, { gpus: [0, 1] }),
      ev('idle_gap', MONDAY + 22 * H, { seconds: 5 * H }),
      ev('last_activity', MONDAY + 27 * H),
      ev('pause_requested', MONDAY + 27.5 * H),
      ev('gpu_released', MONDAY + 28 * H, { gpus: [0, 1] })
    ];
    const days = gpuDays(events, MONDAY + 48 * H + 60, null, 3);
    expect(days.map(d => d.day)).toEqual([
      MONDAY,
      new Date(2025, 0, 7).getTime() / 1000,
      new Date(2025, 0, 8).getTime() / 1000
    ]);
    // two GPUs: Monday 4 h held x 2, 2 h worked x 2; Tuesday 4 h x 2, nothing worked
    expect(days[0]).toMatchObject({ allocatedHours: 8, activeHours: 4 });
    expect(days[1]).toMatchObject({ allocatedHours: 8, activeHours: 0 });
    expect(days[2]).toMatchObject({ allocatedHours: 0, activeHours: 0 });
  });

  it('counts a kernel idle now as idle', () => {
    const events = [ev('gpu_acquired', MONDAY + H, { gpus: [0] })];
    const [day] = gpuDays(events, MONDAY + 5 * H, MONDAY + 2 * H, 1);
    expect(day).toMatchObject({ allocatedHours: 4, activeHours: 1 });
  });
});

describe('usesGpus', () => {
  it('tells CPU-only sessions (no GPU bars for them)', () => {
    expect(usesGpus([ev('resources_acquired', 1, { gpus: [] })])).toBe(false);
    expect(usesGpus([ev('gpu_acquired', 1, { gpus: [0] })])).toBe(true);
  });
});

describe('describeEvent', () => {
  it('says how the server before this one ended (a JupyterHub server stopped)', () => {
    expect(
      describeEvent(
        ev('server_started', 1, {
          after: 'paused at 18:02; the server was stopped'
        })
      )
    ).toBe('Server started again (paused at 18:02; the server was stopped)');
    expect(describeEvent(ev('server_started', 1, {}))).toBe(
      'Server started again'
    );
  });

  it('says how long the spawn waited (a GPU pod pending)', () => {
    expect(describeEvent(ev('start_requested', 1, {}))).toBe(
      'Server start requested (the Hub spawns it)'
    );
    expect(
      describeEvent(
        ev('server_started', 1, {
          after: 'paused at 18:02; the server was stopped',
          waited_seconds: 42.4
        })
      )
    ).toBe(
      'Server started again (paused at 18:02; the server was stopped, 42 s after its start was requested)'
    );
    expect(
      describeEvent(ev('server_started', 1, { waited_seconds: 600 }))
    ).toBe('Server started again (10 min after its start was requested)');
  });

  it('says where a resume waits in line, and why', () => {
    expect(
      describeEvent(
        ev('waiting_for_resources', 1, {
          place: 2,
          reason: '2nd in line; 1 resume on this server gets a GPU first'
        })
      )
    ).toBe(
      'Waiting for a GPU, number 2 in line: 2nd in line; 1 resume on this server gets a GPU first'
    );
  });

  it('says what happened in plain words, never raw JSON', () => {
    const restored = describeEvent(
      ev('state_restored', 1, {
        how: 'files',
        restored: ['model', 'w'],
        failed: {}
      })
    );
    expect(restored).toBe('Restored from files: 2 variables (model, w)');
    expect(
      describeEvent(
        ev('state_restored', 1, {
          how: 'files',
          restored: ['a', 'b', 'c', 'd', 'e', 'f'],
          failed: { conn: 'an open socket' }
        })
      )
    ).toBe(
      'Restored from files: 6 variables (a, b, c, d and 2 more); 1 not restored (conn)'
    );
    expect(
      describeEvent(
        ev('checkpoint_written', 1, {
          checkpoint_id: 3,
          bytes_written: 702_400_000,
          skipped: { log: 'open file' }
        })
      )
    ).toBe('Checkpoint 3 written: 702.4 MB; not saved: log');
    // Sizes are written one way everywhere: the panel's "Bytes saved" beside it says 27.7 KB.
    expect(
      describeEvent(
        ev('checkpoint_written', 1, { checkpoint_id: 1, bytes_written: 27_700 })
      )
    ).toBe('Checkpoint 1 written: 27.7 KB');
    expect(
      describeEvent(
        ev('fully_loaded', 1, {
          bytes: 8_000_000_000,
          seconds: 9.64,
          failed: { big: 'damaged' },
          stopped: false
        })
      )
    ).toBe('All loaded: 8.0 GB in 9.6 s after ready; damaged, taken back: big');
    expect(describeEvent(ev('idle_gap', 1, { seconds: 1800 }))).toBe(
      'Back after 30 min without activity'
    );
    expect(describeEvent(ev('gpu_acquired', 1, { gpus: [0] }))).toBe(
      'GPU 0 acquired'
    );
    expect(
      describeEvent(
        ev('state_restored', 1, { how: 'live', token_matched: true })
      )
    ).toBe('Live session restored (the process that paused)');
    // written before the pause's token was checked: never called proven
    expect(describeEvent(ev('state_restored', 1, { how: 'live' }))).toBe(
      'Live session restored (not proven: recorded before the check)'
    );
    expect(
      describeEvent(ev('checkpoint_restored', 1, { checkpoint_id: 4 }))
    ).toBe('Checkpoint 4 restored in the notebook');
    expect(
      describeEvent(
        ev('snapshot_missing', 1, {
          mode: 'no-snapshots',
          why: 'the pod does not run in GKE Sandbox'
        })
      )
    ).toBe(
      'No pod snapshot (no snapshots): the pod does not run in GKE Sandbox'
    );
    expect(
      describeEvent(
        ev('snapshot_taken', 1, { name: 'a1b2', mode: 'gke-workspaces' })
      )
    ).toBe('Pod snapshot a1b2 taken (GKE Workspaces add-on)');
    // a pause from the dashboard: the checkpoints came first, in the add-on's hold, or not
    expect(
      describeEvent(
        ev('snapshot_taken', 1, {
          name: 'a1b2',
          mode: 'gke-workspaces',
          checkpoints_first: true,
          checkpoint_seconds: 4.25
        })
      )
    ).toBe(
      "Pod snapshot a1b2 taken (GKE Workspaces add-on); checkpoints written first, in the platform's hold (4.3 s)"
    );
    expect(
      describeEvent(
        ev('snapshot_taken', 1, {
          name: 'a1b2',
          checkpoints_first: false,
          checkpoint_seconds: 700
        })
      )
    ).toBe(
      'Pod snapshot a1b2 taken; before the checkpoints were complete (700.0 s were not enough)'
    );
    expect(
      describeEvent(ev('state_restored', 1, { how: 'live', unseen: true }))
    ).toBe(
      'Live session restored by the platform, unseen: nothing was checkpointed before its pause'
    );
    for (const kind of ['kernel_ready', 'failed', 'something_new']) {
      expect(describeEvent(ev(kind, 1, { what: 'x' }))).not.toMatch(/[{}[\]]/);
    }
  });
});
