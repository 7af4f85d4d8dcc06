/**
 * Pure timeline arithmetic for the timeline panel: each pause as phases on a
 * time axis, GPU hours per day, and events in plain words. The words match
 * the GPU-hours report (`jupyter pause report`): *active* is the time the
 * GPU was held less the recorded idle gaps.
 */
import type { ITimelineEvent } from './api';
import { formatBytes } from './view';

/**
 * What the session was doing during a phase of a pause/resume cycle.
 */
export type PhaseKind =
  | 'active'
  | 'idle'
  | 'checkpointing'
  | 'released'
  | 'waiting'
  | 'restoring'
  | 'ready';

/**
 * One phase: from `start` to `end` (epoch seconds).
 */
export interface IPhase {
  kind: PhaseKind;
  start: number;
  end: number;
}

/**
 * One pause and the resume that followed, as consecutive phases.
 */
export interface IPauseBar {
  /**
   * 1-based number of the pause.
   */
  index: number;
  phases: IPhase[];
}

/**
 * GPU hours held and worked on one local calendar day.
 */
export interface IGpuDay {
  /**
   * Local midnight starting the day (epoch seconds).
   */
  day: number;
  allocatedHours: number;
  activeHours: number;
}

const ACQUIRED = ['gpu_acquired', 'resources_acquired'];

function gpusOf(event: ITimelineEvent): number {
  const gpus = event.data?.gpus;
  return Array.isArray(gpus) ? gpus.length : 1;
}

/**
 * Whether the session ever held a GPU (a CPU-only session has no GPU time).
 *
 * @param events Events, oldest first.
 * @returns True when some event granted it GPUs.
 */
export function usesGpus(events: ITimelineEvent[]): boolean {
  return events.some(e => ACQUIRED.includes(e.kind) && gpusOf(e) > 0);
}

/**
 * Each pause as a Gantt bar: active work, idle, checkpointing and stopping,
 * GPU released, waiting for resources, restoring, ready until the next cell.
 *
 * @param events Events, oldest first.
 * @param now The current time (epoch seconds), ends a phase still going on.
 * @returns One bar per pause, oldest first.
 */
export function pauseBars(events: ITimelineEvent[], now: number): IPauseBar[] {
  const bars: IPauseBar[] = [];
  let workSince: number | null = null;
  let lastActivity: number | null = null;
  let bar: IPauseBar | null = null;
  // The phase going on (its end moves with each event); a holder, not a
  // variable, so that the closure and the loop see the same one.
  const current: { phase: IPhase | null } = { phase: null };
  const begin = (kind: PhaseKind, at: number) => {
    if (current.phase) {
      current.phase.end = Math.max(current.phase.start, at);
    }
    current.phase = bar ? { kind, start: at, end: at } : null;
    if (bar && current.phase) {
      bar.phases.push(current.phase);
    }
  };
  for (const event of events) {
    switch (event.kind) {
      case 'gpu_acquired':
        workSince ??= event.at;
        break;
      case 'last_activity':
        lastActivity = event.at;
        break;
      case 'pause_requested': {
        const end = lastActivity ?? event.at;
        bar = { index: bars.length + 1, phases: [] };
        bars.push(bar);
        current.phase = null;
        if (workSince !== null && end > workSince) {
          bar.phases.push({ kind: 'active', start: workSince, end });
        }
        if (event.at > end) {
          bar.phases.push({ kind: 'idle', start: end, end: event.at });
        }
        begin('checkpointing', event.at);
        break;
      }
      case 'kernel_stopped':
      case 'gpu_released':
        if (current.phase?.kind === 'checkpointing') {
          begin('released', event.at);
        }
        break;
      case 'resume_requested':
        begin('waiting', event.at);
        break;
      case 'resources_acquired':
        begin('restoring', event.at);
        break;
      case 'kernel_ready':
        begin('ready', event.at);
        break;
      case 'first_cell_executed':
      case 'failed':
        if (current.phase) {
          current.phase.end = event.at;
        }
        current.phase = null;
        bar = null;
        workSince = event.at;
        lastActivity = null;
        break;
      default:
        break;
    }
  }
  if (current.phase) {
    current.phase.end = now;
  }
  return bars;
}

function localMidnight(at: number): number {
  const date = new Date(at * 1000);
  date.setHours(0, 0, 0, 0);
  return date.getTime() / 1000;
}

function nextMidnight(midnight: number): number {
  const date = new Date(midnight * 1000);
  date.setDate(date.getDate() + 1);
  return date.getTime() / 1000;
}

function addPerDay(
  totals: Map<number, number>,
  start: number,
  end: number,
  gpus: number
): void {
  let at = start;
  while (at < end) {
    const day = localMidnight(at);
    const upto = Math.min(end, nextMidnight(day));
    totals.set(day, (totals.get(day) ?? 0) + ((upto - at) * gpus) / 3600);
    at = upto;
  }
}

/**
 * GPU hours allocated and active per local day, for the last `days` days.
 *
 * @param events Events, oldest first.
 * @param now The current time (epoch seconds).
 * @param lastActivity The running kernel's last activity (epoch seconds),
 *   when it is idle now; null otherwise.
 * @param days How many days, today included.
 * @returns One entry per day, oldest first (days without GPU time too).
 */
export function gpuDays(
  events: ITimelineEvent[],
  now: number,
  lastActivity: number | null,
  days = 21
): IGpuDay[] {
  const held = new Map<number, number>();
  const idle = new Map<number, number>();
  let heldSince: number | null = null;
  let gpus = 0;
  let pauseIdleFrom: number | null = null;
  let lastSeen: number | null = null;
  for (const event of events) {
    if (ACQUIRED.includes(event.kind) && gpusOf(event) > 0) {
      if (heldSince === null) {
        heldSince = event.at;
        gpus = gpusOf(event);
      }
    } else if (event.kind === 'gpu_released' && heldSince !== null) {
      addPerDay(held, heldSince, event.at, gpus);
      if (pauseIdleFrom !== null) {
        addPerDay(idle, Math.max(pauseIdleFrom, heldSince), event.at, gpus);
      }
      heldSince = null;
      pauseIdleFrom = null;
    } else if (event.kind === 'last_activity') {
      lastSeen = event.at;
    } else if (event.kind === 'pause_requested') {
      pauseIdleFrom = lastSeen ?? event.at;
    } else if (event.kind === 'idle_gap' && heldSince !== null) {
      const seconds = Number(event.data?.seconds ?? 0);
      addPerDay(idle, event.at, event.at + seconds, gpus);
    }
  }
  if (heldSince !== null) {
    addPerDay(held, heldSince, now, gpus);
    if (lastActivity !== null && lastActivity > heldSince) {
      addPerDay(idle, lastActivity, now, gpus);
    }
  }
  const result: IGpuDay[] = [];
  let day = localMidnight(now);
  for (let i = 0; i < days; i++) {
    const allocated = held.get(day) ?? 0;
    result.unshift({
      day,
      allocatedHours: allocated,
      activeHours: Math.max(0, allocated - (idle.get(day) ?? 0))
    });
    const previous = new Date(day * 1000);
    previous.setDate(previous.getDate() - 1);
    day = previous.getTime() / 1000;
  }
  return result;
}

function names(value: unknown): string[] {
  if (Array.isArray(value)) {
    return value.map(String);
  }
  return value && typeof value === 'object' ? Object.keys(value) : [];
}

function list(items: string[], max = 4): string {
  const shown = items.slice(0, max).join(', ');
  return items.length > max ? `${shown} and ${items.length - max} more` : shown;
}

const MODES: Record<string, string> = {
  'gke-workspaces': 'GKE Workspaces add-on',
  'pod-snapshots': 'GKE Pod Snapshots',
  'no-snapshots': 'no snapshots'
};

/**
 * ` (GKE Workspaces add-on)`: the workspace pause mode an event names, if any.
 */
function modeOf(data: Record<string, any>): string {
  return data.mode ? ` (${MODES[data.mode] ?? data.mode})` : '';
}

/**
 * How a pause asked outside jupyter_pause went in the platform's hold: its
 * checkpoints written before the snapshot, or not (they took too long).
 */
function heldFor(data: Record<string, any>): string {
  if (data.checkpoints_first === undefined) {
    return '';
  }
  const seconds = Number(data.checkpoint_seconds ?? 0).toFixed(1);
  return data.checkpoints_first
    ? `; checkpoints written first, in the platform's hold (${seconds} s)`
    : `; before the checkpoints were complete (${seconds} s were not enough)`;
}

function shortDuration(seconds: number): string {
  return seconds >= 120 ? minutes(seconds) : `${Math.round(seconds)} s`;
}

function minutes(seconds: number): string {
  return seconds >= 3600
    ? `${(seconds / 3600).toFixed(1)} h`
    : `${Math.round(seconds / 60)} min`;
}

/**
 * An event in plain words, e.g. `Restored from files: 12 variables
 * (model, optimizer, ...); 1 not restored (conn)`. No raw JSON.
 *
 * @param event The event.
 * @returns One sentence.
 */
export function describeEvent(event: ITimelineEvent): string {
  const data = event.data || {};
  switch (event.kind) {
    case 'gpu_acquired':
      return names(data.gpus).length
        ? `GPU ${list(names(data.gpus))} acquired`
        : 'GPU acquired';
    case 'last_activity':
      return 'Last activity before the pause';
    case 'pause_requested':
      return data.reason
        ? `Pause requested (${data.reason})`
        : 'Pause requested';
    case 'checkpoint_written': {
      const skipped = names(data.skipped);
      return (
        `Checkpoint ${data.checkpoint_id ?? ''} written: ` +
        `${formatBytes(Number(data.bytes_written ?? 0))}` +
        (skipped.length ? `; not saved: ${list(skipped)}` : '')
      );
    }
    case 'fully_loaded': {
      const taken = names(data.failed);
      return (
        `All loaded: ${formatBytes(Number(data.bytes ?? 0))}` +
        (typeof data.seconds === 'number'
          ? ` in ${data.seconds.toFixed(1)} s after ready`
          : '') +
        (data.stopped ? ' (stopped by a pause)' : '') +
        (taken.length ? `; damaged, taken back: ${list(taken)}` : '')
      );
    }
    case 'kernel_stopped':
      return 'Kernel stopped';
    case 'gpu_released':
      return data.measured
        ? 'GPU released (measured)'
        : 'GPU released back to the pool';
    case 'start_requested':
      return 'Server start requested (the Hub spawns it)';
    case 'server_started': {
      const waited =
        typeof data.waited_seconds === 'number'
          ? `, ${shortDuration(data.waited_seconds)} after its start was requested`
          : '';
      return data.after
        ? `Server started again (${data.after}${waited})`
        : `Server started again${waited ? ` (${waited.slice(2)})` : ''}`;
    }
    case 'resume_requested':
      return 'Resume requested';
    case 'waiting_for_resources':
      return `Waiting for a GPU, number ${data.place ?? '?'} in line: ${data.reason ?? ''}`;
    case 'resources_acquired':
      return names(data.gpus).length
        ? `GPU ${list(names(data.gpus))} granted`
        : 'Resources granted';
    case 'state_restored': {
      if (data.how === 'live' && data.unseen) {
        // the platform paused and restored the pod faster than the server saw
        return 'Live session restored by the platform, unseen: nothing was checkpointed before its pause';
      }
      if (data.how === 'live') {
        return data.token_matched
          ? 'Live session restored (the process that paused)'
          : 'Live session restored (not proven: recorded before the check)';
      }
      const restored = names(data.restored);
      const failed = names(data.failed);
      return (
        `Restored from files: ${restored.length} variable` +
        (restored.length === 1 ? '' : 's') +
        (restored.length ? ` (${list(restored)})` : '') +
        (failed.length
          ? `; ${failed.length} not restored (${list(failed)})`
          : '')
      );
    }
    case 'kernel_ready':
      return 'Kernel ready';
    case 'first_cell_executed':
      return 'First cell run after the resume';
    case 'snapshot_taken':
      return (
        `Pod snapshot ${data.name ?? ''} taken` + modeOf(data) + heldFor(data)
      );
    case 'snapshot_missing':
      return (
        `No pod snapshot${modeOf(data)}: ${data.why ?? 'unknown'}` +
        heldFor(data)
      );
    case 'checkpoint_restored':
      return `Checkpoint ${data.checkpoint_id ?? ''} restored in the notebook`;
    case 'unrestored_kernel_stopped':
      return 'Kernel opened without the saved state stopped when idle (GPU released)';
    case 'hold_released':
      return 'Incomplete restore accepted: retention applies again';
    case 'idle_gap':
      return `Back after ${minutes(Number(data.seconds ?? 0))} without activity`;
    case 'failed':
      return `Failed: ${data.what ?? 'unknown'}`;
    default: {
      const text = event.kind.replace(/_/g, ' ');
      return text.charAt(0).toUpperCase() + text.slice(1);
    }
  }
}
