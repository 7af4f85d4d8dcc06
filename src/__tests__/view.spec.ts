import {
  formatBytes,
  formatClock,
  formatDuration,
  inFlight,
  percent,
  sessionView,
  shrinkHold,
  skippedSummary
} from '../view';

import { session } from './fakes';

const restore = {
  checkpoint_id: '20250102-180200',
  restored: Array.from({ length: 12 }, (_, i) => `v${i}`),
  failed: {},
  not_saved: {},
  warnings: [],
  seconds: 2.5,
  bytes_read: 3_100_000_000
};

describe('formatBytes', () => {
  it.each([
    [0, '0 B'],
    [999, '999 B'],
    [1000, '1.0 KB'],
    [1536, '1.5 KB'],
    [3_100_000_000, '3.1 GB'],
    [12_000_000_000_000, '12000.0 GB']
  ])('formats %d as %s', (bytes, text) => {
    expect(formatBytes(bytes)).toBe(text);
  });
});

describe('formatDuration', () => {
  it.each([
    [4.21, '4.2 s'],
    [42, '42 s'],
    [185, '3 min 5 s'],
    [120, '2 min'],
    [7800, '2 h 10 min'],
    [3600, '1 h']
  ])('formats %d s as %s', (seconds, text) => {
    expect(formatDuration(seconds)).toBe(text);
  });
});

describe('formatClock', () => {
  it('shows local hours and minutes, zero-padded', () => {
    expect(formatClock(new Date(2025, 0, 2, 8, 5).getTime() / 1000)).toBe(
      '08:05'
    );
  });
});

describe('percent', () => {
  it('floors done/total to an integer percentage', () => {
    expect(percent({ phase: 'writing', done: 42, total: 100 })).toBe(42);
    expect(percent({ phase: 'writing', done: 2, total: 3 })).toBe(66);
  });

  it('is null when the total is unknown', () => {
    expect(percent({ phase: 'starting', done: 0, total: 0 })).toBeNull();
    expect(percent(null)).toBeNull();
  });

  it('clamps to 0..100', () => {
    expect(percent({ phase: 'x', done: 7, total: 5 })).toBe(100);
    expect(percent({ phase: 'x', done: -1, total: 5 })).toBe(0);
  });
});

describe('sessionView', () => {
  it('active: can pause and checkpoint', () => {
    const view = sessionView(session());
    expect(view.label).toBe('Active');
    expect(view.tone).toBe('neutral');
    expect(view.busy).toBe(false);
    expect(view.actions).toEqual([]);
    expect(view).toMatchObject({
      canPause: true,
      canCheckpoint: true,
      canResume: false
    });
  });

  it('active after a failed pause: says so, keeps running', () => {
    const view = sessionView(
      session({
        error: { what: 'stop failed: boom', recovery: 'Nothing was lost.' }
      })
    );
    expect(view.label).toBe('Active (pause failed)');
    expect(view.tone).toBe('warning');
    expect(view.tooltip).toBe('stop failed: boom. Nothing was lost.');
    expect(view.canPause).toBe(true);
  });

  it('checkpointing: percent of the progress', () => {
    const view = sessionView(
      session({
        state: 'checkpointing',
        progress: { phase: 'writing', done: 42, total: 100 }
      })
    );
    expect(view.label).toBe('Checkpointing 42%');
    expect(view.busy).toBe(true);
    expect(view.tooltip).toContain('writing');
    expect(view.canPause || view.canResume || view.canCheckpoint).toBe(false);
  });

  it('checkpointing without a known total: no percent', () => {
    expect(
      sessionView(
        session({
          state: 'checkpointing',
          progress: { phase: 'starting', done: 0, total: 0 }
        })
      ).label
    ).toBe('Checkpointing');
  });

  it('pausing', () => {
    const view = sessionView(session({ state: 'pausing' }));
    expect(view.label).toBe('Pausing');
    expect(view.busy).toBe(true);
  });

  it('paused: since when, and how much was saved', () => {
    const view = sessionView(
      session({
        state: 'paused',
        kernel_id: null,
        checkpoint: { id: 'c1', created: 0, bytes: 3_100_000_000 }
      })
    );
    expect(view.label).toBe('Paused since 18:02 (3.1 GB saved)');
    expect(view.canResume).toBe(true);
    expect(view.canPause).toBe(false);
    expect(view.busy).toBe(false);
  });

  it('paused during a cell: which one, and that it runs on after the resume', () => {
    const view = sessionView(
      session({
        state: 'paused',
        kernel_id: null,
        paused_during_cell: 12,
        checkpoint: { id: 'c1', created: 0, bytes: 3_100_000_000 }
      })
    );
    expect(view.label).toBe('Paused during cell [12]');
    expect(view.tooltip).toContain('in the middle of cell [12] (since 18:02)');
    expect(view.tooltip).toContain('last checkpoint taken at a safe point');
    expect(view.canResume).toBe(true);
    expect(view.canPause).toBe(false);
  });

  it('pausing during a cell says what the server says', () => {
    const message =
      'Pausing during cell [12]: its process is saved as it stands.';
    const view = sessionView(
      session({ state: 'pausing', paused_during_cell: 12, message })
    );
    expect(view.label).toBe('Pausing');
    expect(view.tooltip).toBe(message);
  });

  it('paused, opened again: a kernel without the state, and what Resume restores into it', () => {
    const view = sessionView(
      session({
        state: 'paused',
        kernel_id: 'k2',
        unrestored_kernel: true,
        checkpoint: {
          id: '7',
          created: 0,
          bytes: 1_200_000_000,
          variables: ['model', 'optimizer', 'data']
        }
      })
    );
    expect(view.label).toBe(
      'Paused — press Resume to restore model, optimizer … (3 variables, 1.2 GB) into this kernel'
    );
    expect(view.actions[0]?.kind).toBe('resume');
    expect(view.actions[0]?.label).toBe('Resume');
    expect(view.canResume).toBe(true);
    expect(view.canPause).toBe(false);
    expect(view.tooltip).toContain('Resume restores checkpoint 7 into it');
    // The same session paused with its kernel stopped offers no such thing.
    const stopped = sessionView(
      session({
        state: 'paused',
        kernel_id: null,
        checkpoint: { id: '7', created: 0, bytes: 1_200_000_000 }
      })
    );
    expect(stopped.label).toBe('Paused since 18:02 (1.2 GB saved)');
    expect(stopped.actions).toEqual([]);
  });

  it('running while a newer checkpoint lacks what an older one holds: kept, accept offered', () => {
    const hold = {
      checkpoints: {
        '7': {
          failed: {
            model: 'not in checkpoint 8',
            optimizer: 'not in checkpoint 8'
          },
          since: 0,
          kind: 'shrunk' as const,
          newer: 8
        }
      }
    };
    const view = sessionView(session({ state: 'active', hold }));
    expect(view.label).toBe('Active · checkpoint 7 kept');
    expect(view.tone).toBe('warning');
    expect(view.actions[0]?.kind).toBe('accept');
    expect(view.actions[0]?.label).toBe('Accept');
    expect(view.tooltip).toContain(
      'Checkpoint 8 lacks model, optimizer, which checkpoint 7 holds'
    );
    expect(shrinkHold(session({ state: 'active' }))).toBeNull();
  });

  it('restored from files into a kernel that had defined a name itself: said', () => {
    const view = sessionView(
      session({
        state: 'ready',
        how: 'files',
        restore: {
          checkpoint_id: '7',
          restored: ['note', 'weights'],
          failed: {},
          not_saved: {},
          warnings: [],
          seconds: 0.4,
          bytes_read: 1000,
          replaced: ['note']
        }
      })
    );
    expect(view.label).toBe('Ready: restored from files (2 variables)');
    expect(view.tooltip).toContain(
      'Replaced what this kernel had defined itself: note'
    );
  });

  it('ready before the bytes are in: says how much is still loading, then not', () => {
    const restore = {
      checkpoint_id: '7',
      restored: ['model', 'x'],
      failed: {},
      not_saved: {},
      warnings: [],
      seconds: 0.1,
      bytes_read: 1000,
      loading_bytes: 8_000_000_000
    };
    const loading = sessionView(
      session({
        state: 'ready',
        how: 'files',
        restore,
        progress: {
          phase: 'loading',
          done: 4_900_000_000,
          total: 8_000_000_000
        }
      })
    );
    expect(loading.label).toBe('Ready (3.1 GB of 8.0 GB still loading)');
    expect(loading.tone).toBe('success');
    expect(loading.canPause).toBe(true);
    expect(loading.tooltip).toContain('waits only for its own bytes');
    const loaded = sessionView(
      session({
        state: 'ready',
        how: 'files',
        restore: { ...restore, loading_bytes: 0 },
        progress: null
      })
    );
    expect(loaded.label).toBe('Ready: restored from files (2 variables)');
  });

  it('paused without checkpoint info', () => {
    expect(sessionView(session({ state: 'paused' })).label).toBe(
      'Paused since 18:02'
    );
  });

  it('resuming', () => {
    const view = sessionView(session({ state: 'resuming' }));
    expect(view.label).toBe('Resuming');
    expect(view.busy).toBe(true);
  });

  it('waiting for resources: the short reason, full text in the tooltip', () => {
    const message =
      'Waiting for a GPU: all 1 GPU(s) are in use (by other.ipynb); you are ' +
      'number 1 in the queue and get the next one freed';
    const view = sessionView(
      session({ state: 'waiting-for-resources', message, queue_position: 1 })
    );
    expect(view.label).toBe(
      'Waiting for GPU (all 1 GPU(s) are in use (by other.ipynb))'
    );
    expect(view.tooltip).toBe(message);
    expect(view.tone).toBe('warning');
    expect(view.busy).toBe(true);
  });

  it('waiting for a kernel pod: its place in the line, the scheduler in the tooltip', () => {
    const message =
      'Waiting for a GPU: 2nd in line; 1 resume on this server gets a GPU first; ' +
      'the scheduler says: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu.';
    const view = sessionView(
      session({ state: 'waiting-for-resources', message, queue_position: 2 })
    );
    expect(view.label).toBe('Waiting for GPU (2nd in line)');
    expect(view.tooltip).toBe(message);
  });

  it('waiting for resources: Restore on CPU now where the backend can, and Cancel', () => {
    const waiting = session({
      state: 'waiting-for-resources',
      message: 'Waiting for a GPU: 1st in line',
      queue_position: 1
    });
    const kinds = (options: { restoresOnCpu?: boolean }) =>
      sessionView(waiting, 'ok', undefined, options).actions.map(
        a => `${a.kind}: ${a.label}`
      );
    expect(kinds({ restoresOnCpu: true })).toEqual([
      'resumeOnCpu: Restore on CPU now',
      'cancel: Cancel'
    ]);
    expect(kinds({})).toEqual(['cancel: Cancel']);
  });

  it('waiting for resources without a message: the queue position', () => {
    expect(
      sessionView(
        session({
          state: 'waiting-for-resources',
          message: '',
          queue_position: 2
        })
      ).label
    ).toBe('Waiting for GPU (number 2 in the queue)');
  });

  it('restoring: percent of the progress', () => {
    const view = sessionView(
      session({
        state: 'restoring',
        progress: { phase: 'reading', done: 63, total: 100 }
      })
    );
    expect(view.label).toBe('Restoring 63%');
    expect(view.busy).toBe(true);
  });

  it('ready live', () => {
    const view = sessionView(session({ state: 'ready', how: 'live' }));
    expect(view.label).toBe('Ready: live session restored');
    expect(view.tone).toBe('success');
    expect(view.canPause).toBe(true);
  });

  it('ready from files, nothing skipped', () => {
    const view = sessionView(
      session({ state: 'ready', how: 'files', restore })
    );
    expect(view.label).toBe('Ready: restored from files (12 variables)');
    expect(view.tone).toBe('success');
    expect(view.tooltip).toContain('3.1 GB read in 2.5 s');
  });

  it('ready from files, one variable', () => {
    expect(
      sessionView(
        session({
          state: 'ready',
          how: 'files',
          restore: { ...restore, restored: ['model'] }
        })
      ).label
    ).toBe('Ready: restored from files (1 variable)');
  });

  it('ready from files with skipped variables: count and why', () => {
    const view = sessionView(
      session({
        state: 'ready',
        how: 'files',
        restore: {
          ...restore,
          failed: { conn: 'open socket' },
          not_saved: { fh: 'open socket' }
        }
      })
    );
    expect(view.label).toBe(
      'Ready: restored from files (12 variables; 2 skipped, open socket)'
    );
    expect(view.tone).toBe('warning');
    expect(view.tooltip).toContain('conn: open socket');
    expect(view.tooltip).toContain('fh: open socket');
  });

  it('ready without a resume', () => {
    expect(sessionView(session({ state: 'ready' })).label).toBe('Ready');
  });

  it('failed: the reason and a Restore from files action', () => {
    const view = sessionView(
      session({
        state: 'failed',
        message: 'Resume failed: no kernel',
        error: {
          what: 'resume failed: could not start a python3 kernel',
          recovery:
            'The checkpoint is intact. Resume again to restore from files.'
        }
      })
    );
    expect(view.label).toBe('Failed: could not start a python3 kernel');
    expect(view.tone).toBe('error');
    expect(view.actions[0]?.kind).toBe('resume');
    expect(view.actions[0]?.label).toBe('Restore from files');
    expect(view.tooltip).toContain('checkpoint is intact');
    expect(view.canResume).toBe(true);
  });

  it('partial: what is missing, how to recover, and an Accept action', () => {
    const view = sessionView(
      session({
        state: 'partial',
        how: 'files',
        message:
          'Restored partially from files (0 variables; 2 not restored: data (writable by others), w (writable by others)).',
        hold: {
          checkpoints: {
            '1': {
              failed: { data: 'writable by others', w: 'writable by others' },
              since: 1
            }
          }
        },
        error: {
          what: 'not restored, and kept: checkpoint 1: data, w',
          recovery:
            'No checkpoint of this notebook is deleted until you decide. Run `jupyter pause accept work/model.ipynb`.'
        }
      })
    );
    expect(view.label).toBe('Restored partially (2 missing)');
    expect(view.tone).toBe('warning');
    expect(view.actions[0]?.kind).toBe('accept');
    expect(view.actions[0]?.label).toBe('Accept');
    expect(view.tooltip).toContain('2 not restored: data (writable by others)');
    expect(view.tooltip).toContain('No checkpoint of this notebook is deleted');
    expect(view.canPause).toBe(true);
    expect(view.canResume).toBe(false);
  });

  it('names damaged files of the notebook in the tooltip', () => {
    const view = sessionView(
      session({
        state: 'paused',
        warnings: ['checkpoint 2 cannot be used: Checkpoint 2 is damaged']
      })
    );
    expect(view.tooltip).toContain(
      'Warning: checkpoint 2 cannot be used: Checkpoint 2 is damaged'
    );
  });

  it('no session: nothing to pause', () => {
    const view = sessionView(null);
    expect(view.label).toBe('No kernel');
    expect(view.canPause || view.canResume).toBe(false);
  });

  it('server extension missing', () => {
    const view = sessionView(session(), 'missing');
    expect(view.label).toBe('Pause unavailable');
    expect(view.tooltip).toContain('not installed');
    expect(view.canPause || view.canResume || view.canCheckpoint).toBe(false);
  });

  it('server unreachable', () => {
    const view = sessionView(session(), 'unreachable');
    expect(view.label).toBe('Server unreachable');
    expect(view.tone).toBe('error');
    expect(view.canPause).toBe(false);
  });

  it('server gone after a pause under way: stopped, not an error', () => {
    for (const state of ['checkpointing', 'pausing', 'paused'] as const) {
      const view = sessionView(session({ state }), 'unreachable');
      expect(view.label).toBe('Server stopped');
      expect(view.tone).toBe('neutral');
      expect(view.tooltip).toContain('Start My Server');
      expect(view.canPause || view.canResume).toBe(false);
    }
    expect(sessionView(session({ state: 'active' }), 'unreachable').label).toBe(
      'Server unreachable'
    );
  });

  it('not known yet', () => {
    expect(sessionView(null, 'unknown').label).toBe('Checking...');
  });
});

describe('skippedSummary', () => {
  it('is null when everything was restored', () => {
    expect(skippedSummary(restore)).toBeNull();
  });

  it('truncates long reasons', () => {
    const summary = skippedSummary({
      ...restore,
      failed: { a: 'x'.repeat(40), b: 'y'.repeat(40) }
    });
    expect(summary?.count).toBe(2);
    expect(summary?.why.length).toBe(60);
    expect(summary?.why.endsWith('...')).toBe(true);
  });
});

describe('inFlight', () => {
  it.each([
    ['active', false],
    ['checkpointing', true],
    ['pausing', true],
    ['paused', false],
    ['resuming', true],
    ['waiting-for-resources', true],
    ['restoring', true],
    ['ready', false],
    ['failed', false]
  ] as const)('%s -> %s', (state, expected) => {
    expect(inFlight(session({ state }))).toBe(expected);
  });

  it('null session is not in flight', () => {
    expect(inFlight(null)).toBe(false);
  });
});
