import { INotebookTracker } from '@jupyterlab/notebook';
import { TranslationBundle } from '@jupyterlab/translation';
import { Widget } from '@lumino/widgets';

import { IStatus } from './api';
import { renderChip } from './chip';
import { PauseManager } from './model';

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

/**
 * The status bar item: the pause state of the current notebook.
 */
export class PauseStatusItem extends Widget {
  /**
   * Create the item.
   *
   * @param manager The shared manager.
   * @param tracker The notebook tracker (the current notebook).
   */
  constructor(
    private _manager: PauseManager,
    private _tracker: INotebookTracker
  ) {
    super();
    this.addClass('jp-JupyterPause-StatusItem');
    const inner = document.createElement('span');
    inner.className = 'jp-JupyterPause-StatusChip';
    const label = document.createElement('span');
    label.className = 'jp-JupyterPause-ChipLabel';
    inner.append(label);
    this.node.append(inner);
    this._inner = inner;
    this._manager.changed.connect(this._render, this);
    this._tracker.currentChanged.connect(this._render, this);
    this._render();
  }

  /**
   * Dispose the item.
   */
  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._manager.changed.disconnect(this._render, this);
    this._tracker.currentChanged.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    const panel = this._tracker.currentWidget;
    if (!panel) {
      this._inner.hidden = true;
      return;
    }
    this._inner.hidden = false;
    const view = this._manager.modelFor(panel).view;
    // The status bar is where a user looks for the server's state: a backend that
    // quietly does less than its name (criu without criu) is said in the tooltip.
    const problem = backendProblem(this._manager.status, this._manager.trans);
    renderChip(this._inner, {
      ...view,
      label: this._manager.trans.__('Pause: %1', view.label),
      tooltip: problem ? `${view.tooltip}\n\n${problem}` : view.tooltip
    });
  }

  private _inner: HTMLElement;
}
