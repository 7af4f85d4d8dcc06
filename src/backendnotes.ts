/**
 * What the tooltips say about the server's backend beside a notebook's state:
 * a backend that cannot do all its name says (criu without a criu binary), and
 * how a pause snapshots the pod on a cluster (the workspace backend's mode).
 */
import { TranslationBundle } from '@jupyterlab/translation';

import { IStatus } from './api';

/**
 * Why the server's backend cannot do all it is named for here, and what it does
 * instead (e.g. the criu backend without a criu binary: pauses stop kernels),
 * in words; null when nothing keeps it from working.
 *
 * @param status The server's status (`GET /jupyter-pause/status`).
 * @param trans The translation bundle.
 * @returns The sentence, or null.
 */
export function backendProblem(
  status: IStatus | null,
  trans: TranslationBundle
): string | null {
  const details = status?.resources?.details ?? {};
  const problem = details['problem'];
  if (!status || typeof problem !== 'string' || !problem) {
    return null;
  }
  const fallback = details['fallback'];
  return typeof fallback === 'string' && fallback
    ? trans.__(
        'The %1 backend cannot work fully here: %2; %3.',
        status.backend,
        problem,
        fallback
      )
    : trans.__(
        'The %1 backend cannot work fully here: %2.',
        status.backend,
        problem
      );
}

const MODE_NAMES: Record<string, string> = {
  'gke-workspaces': 'GKE Workspaces (the snapshot add-on snapshots the pod)',
  'pod-snapshots':
    'GKE Pod Snapshots (a snapshot of the pod, pinned for the resume)',
  'no-snapshots':
    'no pod snapshot (the checkpoints only; the resume restores from files)',
  jupyterhub:
    'the Hub stops this server and its GPU goes back (no memory snapshot: the resume restores from files)'
};

/**
 * How a pause snapshots the pod on the workspace backend, and why, in words;
 * null on other backends.
 *
 * @param status The server's status (`GET /jupyter-pause/status`).
 * @param trans The translation bundle.
 * @returns The sentence, or null.
 */
export function backendMode(
  status: IStatus | null,
  trans: TranslationBundle
): string | null {
  const details = status?.resources?.details ?? {};
  const mode = details['mode'];
  if (!status || typeof mode !== 'string' || !mode) {
    return null;
  }
  const reason = details['mode_reason'];
  return trans.__(
    'A pause here: %1.%2',
    MODE_NAMES[mode] ?? mode,
    typeof reason === 'string' && reason ? ` ${reason}.` : ''
  );
}

/**
 * What the tooltips add about the server's backend: its problem, and how it
 * pauses (both null when there is nothing to say).
 *
 * @param tooltip The view's own tooltip.
 * @param status The server's status.
 * @param trans The translation bundle.
 * @returns The tooltip with the backend's sentences after a blank line.
 */
export function withBackendNotes(
  tooltip: string,
  status: IStatus | null,
  trans: TranslationBundle
): string {
  const notes = [
    backendProblem(status, trans),
    backendMode(status, trans)
  ].filter((note): note is string => note !== null);
  return notes.length ? `${tooltip}\n\n${notes.join('\n')}` : tooltip;
}

/**
 * What the pause confirmation says a pause of `path` does on this server's
 * backend: under JupyterHub the whole server stops, with every notebook in it.
 *
 * @param path The notebook's path.
 * @param status The server's status (`GET /jupyter-pause/status`).
 * @param trans The translation bundle.
 * @returns The sentence.
 */
export function pauseConsequence(
  path: string,
  status: IStatus | null,
  trans: TranslationBundle
): string {
  const details = status?.resources?.details ?? {};
  if (details['mode'] === 'jupyterhub') {
    return trans.__(
      'The state of %1 and of every other notebook running in this server is saved to disk, then the Hub stops the whole server and its GPU goes back. Start your server again from the Hub (Home, Start My Server) and Resume brings the variables back.',
      path
    );
  }
  return trans.__(
    'The state of %1 is saved to disk, its kernel is stopped and its GPU released for others. Resume brings the variables back.',
    path
  );
}
