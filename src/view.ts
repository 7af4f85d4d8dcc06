/**
 * Pure state-to-view logic: a session's JSON in, what the chip, the status
 * bar and the commands show out. No DOM, no requests: unit-tested with jest.
 */
import { TranslationBundle, nullTranslator } from '@jupyterlab/translation';

import type {
  IProgress,
  IRestoreResult,
  ISession,
  ServerAvailability,
  SessionState
} from './api';
import type { IImportOrigin } from './sessionfile';

/**
 * The colour family of a chip.
 */
export type Tone = 'neutral' | 'info' | 'success' | 'warning' | 'error';

/**
 * The button a chip offers, bound to a command.
 */
export interface IViewAction {
  /**
   * What the action does: a resume, accepting an incomplete restore, or, while a
   * resume waits for a GPU, restoring on CPU now or cancelling the wait.
   */
  kind: 'resume' | 'accept' | 'resumeOnCpu' | 'cancel';
  /**
   * The button text.
   */
  label: string;
}

/**
 * What the server's backend can do, as its status says.
 */
export interface IViewOptions {
  /**
   * A resume can bring a session back without its GPUs, from files
   * (`GET status`'s `restores_on_cpu`).
   */
  restoresOnCpu?: boolean;
  /**
   * Where the session came from when it is an import not trusted yet (its
   * resume asks for trust first), else `null`.
   */
  untrustedImport?: IImportOrigin | null;
}

/**
 * Everything the UI shows about one notebook's pause state.
 */
export interface IPauseView {
  /**
   * The chip text, e.g. `Paused since 18:02 (3.1 GB saved)`.
   */
  label: string;
  /**
   * The colour family.
   */
  tone: Tone;
  /**
   * A transition is in flight (show a spinner, poll fast).
   */
  busy: boolean;
  /**
   * An extra button shown in the chip (only for failures), or `null`.
   */
  actions: IViewAction[];
  /**
   * Longer text for the tooltip.
   */
  tooltip: string;
  /**
   * Whether the notebook can be paused now.
   */
  canPause: boolean;
  /**
   * Whether the notebook can be resumed now.
   */
  canResume: boolean;
  /**
   * Whether a checkpoint can be written now.
   */
  canCheckpoint: boolean;
  /**
   * The session state, or a pseudo-state when there is no session.
   */
  state: SessionState | 'none' | 'unavailable' | 'unknown';
}

/**
 * States of a pause or resume in flight.
 */
export const IN_FLIGHT_STATES: ReadonlyArray<SessionState> = [
  'checkpointing',
  'pausing',
  'resuming',
  'waiting-for-resources',
  'restoring'
];

/**
 * Format a byte count like the server does (decimal units).
 *
 * @param bytes A number of bytes.
 * @returns E.g. `512 B`, `3.1 GB`.
 */
export function formatBytes(bytes: number): string {
  let n = bytes;
  for (const unit of ['B', 'KB', 'MB', 'GB']) {
    if (Math.abs(n) < 1000 || unit === 'GB') {
      return unit === 'B' ? `${Math.round(n)} B` : `${n.toFixed(1)} ${unit}`;
    }
    n /= 1000;
  }
  return `${n} GB`;
}

/**
 * Format a duration in seconds for people.
 *
 * @param seconds A duration.
 * @param trans The translation bundle.
 * @returns E.g. `4.2 s`, `3 min 5 s`, `2 h 10 min`.
 */
export function formatDuration(
  seconds: number,
  trans: TranslationBundle = nullTranslator.load('jupyter_pause')
): string {
  if (seconds < 60) {
    return trans.__('%1 s', seconds.toFixed(seconds < 10 ? 1 : 0));
  }
  if (seconds < 3600) {
    const minutes = Math.floor(seconds / 60);
    const rest = Math.round(seconds - minutes * 60);
    return rest
      ? trans.__('%1 min %2 s', minutes, rest)
      : trans.__('%1 min', minutes);
  }
  const hours = Math.floor(seconds / 3600);
  const minutes = Math.round((seconds - hours * 3600) / 60);
  return minutes
    ? trans.__('%1 h %2 min', hours, minutes)
    : trans.__('%1 h', hours);
}

/**
 * Local wall-clock time of an epoch timestamp.
 *
 * @param epochSeconds Seconds since the epoch.
 * @returns `HH:MM` in local time.
 */
export function formatClock(epochSeconds: number): string {
  const date = new Date(epochSeconds * 1000);
  const pad = (n: number) => String(n).padStart(2, '0');
  return `${pad(date.getHours())}:${pad(date.getMinutes())}`;
}

/**
 * The percentage of a progress report, or `null` when its total is unknown.
 *
 * @param progress A progress report.
 * @returns An integer from 0 to 100, or `null`.
 */
export function percent(progress: IProgress | null | undefined): number | null {
  if (!progress || !(progress.total > 0)) {
    return null;
  }
  const value = Math.floor((100 * progress.done) / progress.total);
  return Math.min(100, Math.max(0, value));
}

/**
 * A label with its progress percentage when known, e.g. `Restoring 63%`.
 */
function withPercent(
  label: string,
  progress: IProgress | null,
  trans: TranslationBundle
): string {
  const value = percent(progress);
  return value === null ? label : trans.__('%1 %2%', label, value);
}

/**
 * Why variables were not restored, shortened for the chip.
 *
 * @param restore The restore result.
 * @returns The count and the distinct reasons, or `null` when nothing was skipped.
 */
export function skippedSummary(
  restore: IRestoreResult
): { count: number; why: string; details: string } | null {
  const skipped = { ...(restore.not_saved || {}), ...(restore.failed || {}) };
  const names = Object.keys(skipped);
  if (names.length === 0) {
    return null;
  }
  const reasons = Array.from(new Set(names.map(name => skipped[name])));
  let why = reasons.join('; ');
  if (why.length > 60) {
    why = `${why.slice(0, 57)}...`;
  }
  const details = names.map(name => `${name}: ${skipped[name]}`).join('\n');
  return { count: names.length, why, details };
}

/**
 * The reason of a wait for resources, from the session message.
 */
function waitReason(session: ISession, trans: TranslationBundle): string {
  let reason = session.message.replace(/^Waiting for an? GPU:?\s*/i, '');
  reason = reason.split(';')[0].replace(/\.$/, '').trim();
  if (!reason && session.queue_position) {
    reason = trans.__('number %1 in the queue', session.queue_position);
  }
  return reason;
}

const UNAVAILABLE: Pick<
  IPauseView,
  'busy' | 'actions' | 'canPause' | 'canResume' | 'canCheckpoint'
> = {
  busy: false,
  actions: [],
  canPause: false,
  canResume: false,
  canCheckpoint: false
};

/**
 * Compute what to show for a notebook.
 *
 * @param session The session JSON, or `null` when the server knows no session (404).
 * @param server Whether the server extension answers.
 * @param trans The translation bundle of the labels and tooltips.
 * @param options What the server's backend can do.
 * @returns The view.
 */
export function sessionView(
  session: ISession | null,
  server: ServerAvailability = 'ok',
  trans: TranslationBundle = nullTranslator.load('jupyter_pause'),
  options: IViewOptions = {}
): IPauseView {
  const view =
    session && (session.state === 'active' || session.state === 'ready')
      ? withShrinkHold(
          baseView(session, server, trans, options),
          session,
          trans
        )
      : baseView(session, server, trans, options);
  const warnings = session?.warnings ?? [];
  if (server !== 'ok' || warnings.length === 0) {
    return view;
  }
  const named = warnings.map(w => trans.__('Warning: %1', w));
  return { ...view, tooltip: [view.tooltip, ...named].join('\n') };
}

/**
 * A checkpoint kept because a newer one lacks most of its variables (a kernel
 * without the session's state wrote it, or the notebook deleted them).
 *
 * @param session The session.
 * @returns The kept checkpoint, the newer one and the missing names, or `null`.
 */
export function shrinkHold(
  session: ISession
): { kept: string; newer: number | undefined; missing: string[] } | null {
  for (const [kept, entry] of Object.entries(session.hold?.checkpoints ?? {})) {
    if (entry.kind === 'shrunk') {
      return { kept, newer: entry.newer, missing: Object.keys(entry.failed) };
    }
  }
  return null;
}

/**
 * Names for a chip, e.g. `model, optimizer …`.
 */
function someNames(names: string[], shown = 2): string {
  return names.slice(0, shown).join(', ') + (names.length > shown ? ' …' : '');
}

/**
 * A running session whose newest checkpoint shrank: say which one is kept,
 * and offer to accept.
 */
function withShrinkHold(
  view: IPauseView,
  session: ISession,
  trans: TranslationBundle
): IPauseView {
  const shrink = shrinkHold(session);
  if (!shrink || view.actions.length) {
    return view;
  }
  return {
    ...view,
    label: trans.__('%1 · checkpoint %2 kept', view.label, shrink.kept),
    tone: 'warning',
    actions: [{ kind: 'accept', label: trans.__('Accept') }],
    tooltip: [
      view.tooltip,
      trans.__(
        'Checkpoint %1 lacks %2, which checkpoint %3 holds: checkpoint %3 and every older one are kept until a checkpoint holds them again, or until you accept. If this kernel was started without the saved state, `%checkpoint restore %3` brings it back.',
        shrink.newer ?? '?',
        someNames(shrink.missing, 4),
        shrink.kept
      )
    ].join('\n')
  };
}

/**
 * A paused notebook opened again: a kernel runs without the saved state.
 */
function unrestoredView(
  session: ISession,
  trans: TranslationBundle
): Pick<IPauseView, 'label' | 'tone' | 'actions' | 'tooltip'> {
  const checkpoint = session.checkpoint;
  const names = checkpoint?.variables ?? [];
  return {
    label: checkpoint
      ? trans.__(
          'Paused — press Resume to restore %1 (%2, %3) into this kernel',
          someNames(names),
          trans._n('%1 variable', '%1 variables', names.length),
          formatBytes(checkpoint.bytes || 0)
        )
      : trans.__(
          'Paused — press Resume to restore the saved state into this kernel'
        ),
    tone: 'warning',
    actions: [{ kind: 'resume', label: trans.__('Resume') }],
    tooltip: trans.__(
      'A new kernel runs for this notebook, without the state saved when it was paused. Resume restores checkpoint %1 into it, from files. What you define in it meanwhile is kept, except names the checkpoint also holds: the restore replaces those, and names them.',
      checkpoint?.id ?? '?'
    )
  };
}

/**
 * A paused session imported from a session file, not trusted yet.
 */
function untrustedImportView(
  origin: IImportOrigin,
  trans: TranslationBundle
): Pick<IPauseView, 'label' | 'tone' | 'tooltip'> {
  const lines = [
    trans.__(
      'This session was made by %1 on %2 (%3) and imported from a session file. Restoring it runs code from the file: Resume asks you to trust it first.',
      origin.madeBy,
      origin.madeOn,
      origin.madeAt
    )
  ];
  if (origin.differences.length) {
    lines.push(trans.__('Differs here: %1', origin.differences.join('; ')));
  }
  return {
    label: trans.__(
      'Paused (imported from %1 on %2)',
      origin.madeBy,
      origin.madeOn
    ),
    tone: 'warning',
    tooltip: lines.join('\n')
  };
}

/**
 * The states of a pause under way or done: the server may go away after them.
 */
const PAUSE_FLOW: ReadonlySet<string> = new Set([
  'checkpointing',
  'pausing',
  'paused'
]);

function baseView(
  session: ISession | null,
  server: ServerAvailability,
  trans: TranslationBundle,
  options: IViewOptions
): IPauseView {
  if (server === 'missing') {
    return {
      ...UNAVAILABLE,
      state: 'unavailable',
      label: trans.__('Pause unavailable'),
      tone: 'warning',
      tooltip: trans.__(
        'The jupyter_pause server extension is not installed or not enabled (GET /jupyter-pause/status answered 404). Ask your administrator to run `jupyter server extension enable jupyter_pause`.'
      )
    };
  }
  if (server === 'unreachable' && session && PAUSE_FLOW.has(session.state)) {
    // A pause that gives the whole server back (JupyterHub, a pod) ends with no server to
    // ask: the last answer was the pause under way.
    return {
      ...UNAVAILABLE,
      state: 'unavailable',
      label: trans.__('Server stopped'),
      tone: 'neutral',
      tooltip: trans.__(
        'The server stopped while this notebook was pausing: a pause under JupyterHub or on a cluster gives the whole server back, with its GPU, once every notebook is checkpointed. Start your server again (JupyterHub: Home, Start My Server); this notebook then says what it saved, and Resume restores it.'
      )
    };
  }
  if (server === 'unreachable') {
    return {
      ...UNAVAILABLE,
      state: 'unavailable',
      label: trans.__('Server unreachable'),
      tone: 'error',
      tooltip: trans.__(
        'The Jupyter server does not answer; pause and resume are unavailable until it is back. Retrying.'
      )
    };
  }
  if (server === 'unknown') {
    return {
      ...UNAVAILABLE,
      state: 'unknown',
      label: trans.__('Checking...'),
      tone: 'neutral',
      tooltip: trans.__(
        'Asking the server for the pause state of this notebook.'
      )
    };
  }
  if (session === null) {
    return {
      ...UNAVAILABLE,
      state: 'none',
      label: trans.__('No kernel'),
      tone: 'neutral',
      tooltip: trans.__(
        'This notebook has no kernel and no checkpoint: there is nothing to pause.'
      )
    };
  }
  const base = {
    state: session.state,
    busy: false,
    actions: [] as IViewAction[],
    canPause: false,
    canResume: false,
    canCheckpoint: false
  };
  switch (session.state) {
    case 'active': {
      const running = {
        ...base,
        canPause: true,
        canCheckpoint: true
      };
      if (session.error) {
        return {
          ...running,
          label: trans.__('Active (pause failed)'),
          tone: 'warning',
          tooltip: trans
            .__('%1. %2', session.error.what, session.error.recovery)
            .trim()
        };
      }
      return {
        ...running,
        label: trans.__('Active'),
        tone: 'neutral',
        tooltip: session.busy
          ? trans.__(
              'The kernel is running a cell; a pause waits for it to finish.'
            )
          : trans.__(
              'The kernel is running. Pause saves its state and frees its GPU.'
            )
      };
    }
    case 'checkpointing':
      return {
        ...base,
        busy: true,
        label: withPercent(trans.__('Checkpointing'), session.progress, trans),
        tone: 'info',
        tooltip: session.progress?.phase
          ? trans.__('Saving the session state (%1).', session.progress.phase)
          : trans.__('Saving the session state.')
      };
    case 'pausing':
      return {
        ...base,
        busy: true,
        label: trans.__('Pausing'),
        tone: 'info',
        tooltip:
          typeof session.paused_during_cell === 'number'
            ? session.message
            : trans.__('Stopping the kernel and releasing its GPU.')
      };
    case 'paused': {
      const since = formatClock(session.since);
      if (options.untrustedImport) {
        return {
          ...base,
          canResume: true,
          ...untrustedImportView(options.untrustedImport, trans)
        };
      }
      if (session.unrestored_kernel) {
        return { ...base, canResume: true, ...unrestoredView(session, trans) };
      }
      if (typeof session.paused_during_cell === 'number') {
        return {
          ...base,
          canResume: true,
          label: trans.__(
            'Paused during cell [%1]',
            session.paused_during_cell
          ),
          tone: 'neutral',
          tooltip: trans.__(
            'The kernel process is saved in the middle of cell [%1] (since %2) and its GPU released. Resume to let the cell run on; if its process cannot come back, the last checkpoint taken at a safe point is restored instead.',
            session.paused_during_cell,
            since
          )
        };
      }
      return {
        ...base,
        canResume: true,
        label: session.checkpoint
          ? trans.__(
              'Paused since %1 (%2 saved)',
              since,
              formatBytes(session.checkpoint.bytes || 0)
            )
          : trans.__('Paused since %1', since),
        tone: 'neutral',
        tooltip: trans.__(
          'The kernel is stopped and its GPU released; its state is saved on disk. Resume to continue where you left off.'
        )
      };
    }
    case 'resuming':
      return {
        ...base,
        busy: true,
        label: trans.__('Resuming'),
        tone: 'info',
        tooltip: session.message || trans.__('Resuming.')
      };
    case 'waiting-for-resources': {
      const reason = waitReason(session, trans);
      const actions: IViewAction[] = [
        { kind: 'cancel', label: trans.__('Cancel') }
      ];
      if (options.restoresOnCpu) {
        actions.unshift({
          kind: 'resumeOnCpu',
          label: trans.__('Restore on CPU now')
        });
      }
      return {
        ...base,
        actions,
        busy: true,
        label: reason
          ? trans.__('Waiting for GPU (%1)', reason)
          : trans.__('Waiting for GPU'),
        tone: 'warning',
        tooltip:
          session.message ||
          trans.__(
            'Waiting for a GPU; the notebook resumes as soon as one is free.'
          )
      };
    }
    case 'restoring':
      return {
        ...base,
        busy: true,
        label: withPercent(trans.__('Restoring'), session.progress, trans),
        tone: 'info',
        tooltip: session.progress?.phase
          ? trans.__('Restoring the session (%1).', session.progress.phase)
          : session.message || trans.__('Restoring the session state.')
      };
    case 'ready':
      return { ...base, ...readyView(session, trans) };
    case 'partial': {
      const missing = Object.values(session.hold?.checkpoints ?? {}).reduce(
        (count, held) => count + Object.keys(held.failed || {}).length,
        0
      );
      return {
        ...base,
        canPause: true,
        canCheckpoint: true,
        label: trans._n(
          'Restored partially (%1 missing)',
          'Restored partially (%1 missing)',
          missing
        ),
        tone: 'warning',
        actions: [{ kind: 'accept', label: trans.__('Accept') }],
        tooltip: [session.message, session.error?.recovery || '']
          .join('\n')
          .trim()
      };
    }
    case 'failed': {
      const what =
        session.error?.what || session.message || trans.__('unknown error');
      const reason = what.replace(/^(resume|pause) failed:\s*/i, '');
      return {
        ...base,
        canResume: true,
        label: trans.__('Failed: %1', reason),
        tone: 'error',
        actions: [{ kind: 'resume', label: trans.__('Restore from files') }],
        tooltip: session.error?.recovery || session.message
      };
    }
    default:
      return {
        ...base,
        label: session.state,
        tone: 'neutral',
        tooltip: session.message
      };
  }
}

function readyView(
  session: ISession,
  trans: TranslationBundle
): Pick<
  IPauseView,
  'label' | 'tone' | 'tooltip' | 'canPause' | 'canCheckpoint'
> {
  const running = { canPause: true, canCheckpoint: true };
  if (session.how === 'live') {
    return {
      ...running,
      label: trans.__('Ready: live session restored'),
      tone: 'success',
      tooltip: trans.__(
        'The same kernel process came back: every variable is intact.'
      )
    };
  }
  if (session.how === 'files' && session.restore) {
    const restore = session.restore;
    const restored = trans._n(
      '%1 variable',
      '%1 variables',
      restore.restored.length
    );
    const skipped = skippedSummary(restore);
    const lines = [
      trans.__(
        'Restored from checkpoint %1: %2.',
        restore.checkpoint_id,
        restore.restored.join(', ') || trans.__('nothing')
      ),
      trans.__(
        '%1 read in %2.',
        formatBytes(restore.bytes_read || 0),
        formatDuration(restore.seconds || 0, trans)
      )
    ];
    if (skipped) {
      lines.push(trans.__('Not restored:\n%1', skipped.details));
    }
    if (restore.replaced?.length) {
      lines.push(
        trans.__(
          'Replaced what this kernel had defined itself: %1',
          restore.replaced.join(', ')
        )
      );
    }
    lines.push(...(restore.warnings || []));
    const loading = session.progress;
    if (restore.loading_bytes && loading?.phase === 'loading') {
      const total = loading.total || restore.loading_bytes;
      lines.unshift(
        trans.__(
          'Large arrays and tensors came back as maps of the checkpoint and load behind the notebook: a cell that reads one waits only for its own bytes.'
        )
      );
      return {
        ...running,
        label: trans.__(
          'Ready (%1 of %2 still loading)',
          formatBytes(Math.max(0, total - (loading.done || 0))),
          formatBytes(total)
        ),
        tone: skipped ? 'warning' : 'success',
        tooltip: lines.join('\n')
      };
    }
    return {
      ...running,
      label: skipped
        ? trans.__(
            'Ready: restored from files (%1; %2 skipped, %3)',
            restored,
            skipped.count,
            skipped.why
          )
        : trans.__('Ready: restored from files (%1)', restored),
      tone: skipped ? 'warning' : 'success',
      tooltip: lines.join('\n')
    };
  }
  return {
    ...running,
    label: trans.__('Ready'),
    tone: 'success',
    tooltip: session.message || trans.__('The kernel is running.')
  };
}

/**
 * Whether a session is in a transition (pause or resume in flight).
 *
 * @param session The session, or `null`.
 * @returns `true` while the server is busy with it.
 */
export function inFlight(session: ISession | null): boolean {
  return !!session && IN_FLIGHT_STATES.includes(session.state);
}
