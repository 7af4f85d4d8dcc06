/**
 * Pure timeline arithmetic: one row per pause/resume cycle, for the chart.
 */
import type { ITimelineEvent } from './api';

/**
 * One pause and the resume that followed it.
 */
export interface ICycle {
  /**
   * 1-based number of the pause.
   */
  index: number;
  /**
   * When the pause was requested (epoch seconds).
   */
  pausedAt: number;
  /**
   * Seconds the GPU was held before this pause (since it was last acquired).
   */
  allocatedSeconds: number;
  /**
   * Seconds of the held time until the last activity before the pause.
   */
  activeSeconds: number;
  /**
   * Seconds the GPU was back in the pool (until re-acquired, or now).
   */
  releasedSeconds: number;
  /**
   * Seconds from the resume request to the kernel being ready, if it resumed.
   */
  resumeToReadySeconds: number | null;
  /**
   * Seconds from the resume request to the next cell run, if one ran.
   */
  resumeToNextCellSeconds: number | null;
}

/**
 * Split a timeline into pause/resume cycles.
 *
 * The active time of a cycle is counted from the GPU's acquisition to the
 * last activity before the pause: the time the GPU was held for work, as
 * opposed to held while idle.
 *
 * @param events Events, oldest first.
 * @param now The current time (epoch seconds), for a pause still in effect.
 * @returns The cycles, oldest first.
 */
export function cycles(events: ITimelineEvent[], now: number): ICycle[] {
  const result: ICycle[] = [];
  let heldSince: number | null = null;
  let lastActivity: number | null = null;
  let current: ICycle | null = null;
  let releasedSince: number | null = null;
  let resumeAt: number | null = null;
  for (const event of events) {
    switch (event.kind) {
      case 'gpu_acquired':
      case 'resources_acquired':
        if (current && releasedSince !== null) {
          current.releasedSeconds += event.at - releasedSince;
        }
        releasedSince = null;
        if (heldSince === null) {
          heldSince = event.at;
        }
        break;
      case 'last_activity':
        lastActivity = event.at;
        break;
      case 'pause_requested':
        current = {
          index: result.length + 1,
          pausedAt: event.at,
          allocatedSeconds: 0,
          activeSeconds:
            heldSince !== null && lastActivity !== null
              ? Math.max(0, lastActivity - heldSince)
              : 0,
          releasedSeconds: 0,
          resumeToReadySeconds: null,
          resumeToNextCellSeconds: null
        };
        result.push(current);
        resumeAt = null;
        break;
      case 'gpu_released':
        if (current && heldSince !== null) {
          current.allocatedSeconds += event.at - heldSince;
          current.activeSeconds = Math.min(
            current.activeSeconds,
            current.allocatedSeconds
          );
        }
        heldSince = null;
        releasedSince = event.at;
        break;
      case 'resume_requested':
        resumeAt = event.at;
        break;
      case 'kernel_ready':
        if (current && resumeAt !== null) {
          current.resumeToReadySeconds = event.at - resumeAt;
        }
        break;
      case 'first_cell_executed':
        if (current && resumeAt !== null) {
          current.resumeToNextCellSeconds = event.at - resumeAt;
        }
        break;
      default:
        break;
    }
  }
  if (current && releasedSince !== null) {
    current.releasedSeconds += now - releasedSince;
  }
  return result;
}

/**
 * A readable name of an event kind.
 *
 * @param kind E.g. `gpu_released`.
 * @returns E.g. `GPU released`.
 */
export function eventLabel(kind: string): string {
  const text = kind.replace(/_/g, ' ').replace(/\bgpu\b/g, 'GPU');
  return text.charAt(0).toUpperCase() + text.slice(1);
}
