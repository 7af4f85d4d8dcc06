import { INotebookTracker } from '@jupyterlab/notebook';
import { Widget } from '@lumino/widgets';

import { withBackendNotes } from './backendnotes';
import { renderChip } from './chip';
import { PauseManager } from './model';

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
    // quietly does less than its name (criu without criu), and how a pause snapshots
    // the pod (on a cluster), are said in the tooltip.
    renderChip(this._inner, {
      ...view,
      label: this._manager.trans.__('Pause: %1', view.label),
      tooltip: withBackendNotes(
        view.tooltip,
        this._manager.status,
        this._manager.trans
      )
    });
  }

  private _inner: HTMLElement;
}
