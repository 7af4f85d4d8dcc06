import { CommandRegistry } from '@lumino/commands';
import { Widget } from '@lumino/widgets';

import { NotebookPauseModel } from './model';
import { withBackendNotes } from './backendnotes';
import { IPauseView } from './view';

/**
 * Command ids the chip triggers (passed in to keep this module free of the plugin).
 */
export interface IChipCommands {
  /**
   * The command of the chip's resume button (after a failure).
   */
  resume: string;
  /**
   * The command of the chip's accept button (after an incomplete restore).
   */
  accept: string;
  /**
   * The command of the chip's restore-on-CPU button (while waiting for a GPU).
   */
  resumeOnCpu: string;
  /**
   * The command of the chip's cancel button (while waiting for a GPU).
   */
  cancel: string;
  /**
   * The command run when the chip itself is clicked.
   */
  timeline: string;
}

/**
 * Render a view into a chip element (shared by the toolbar chip and the status bar).
 *
 * @param node The chip element.
 * @param view The view to show.
 */
export function renderChip(node: HTMLElement, view: IPauseView): void {
  node.dataset.tone = view.tone;
  node.dataset.state = view.state;
  node.title = view.tooltip;
  node.classList.toggle('jp-JupyterPause-Chip-busy', view.busy);
  const label = node.querySelector('.jp-JupyterPause-ChipLabel');
  if (label && label.textContent !== view.label) {
    label.textContent = view.label;
  }
}

/**
 * The notebook toolbar chip: the pause state of its notebook, live.
 */
export class PauseChip extends Widget {
  /**
   * Create a chip.
   *
   * @param model The notebook's pause model.
   * @param commands The application commands.
   * @param ids The commands the chip triggers.
   */
  constructor(
    private _model: NotebookPauseModel,
    private _commands: CommandRegistry,
    private _ids: IChipCommands
  ) {
    super();
    this.addClass('jp-JupyterPause-Chip');
    const dot = document.createElement('span');
    dot.className = 'jp-JupyterPause-ChipDot';
    const label = document.createElement('span');
    label.className = 'jp-JupyterPause-ChipLabel';
    label.setAttribute('role', 'status');
    label.setAttribute('aria-live', 'polite');
    label.addEventListener('click', () => {
      void this._commands.execute(this._ids.timeline);
    });
    this._buttons = document.createElement('span');
    this._buttons.className = 'jp-JupyterPause-ChipActions';
    this.node.append(dot, label, this._buttons);
    this._model.changed.connect(this._render, this);
    this._model.manager.changed.connect(this._render, this);
    this._render();
  }

  /**
   * Dispose the chip.
   */
  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._model.changed.disconnect(this._render, this);
    this._model.manager.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    const manager = this._model.manager;
    const view = {
      ...this._model.view,
      tooltip: withBackendNotes(
        this._model.view.tooltip,
        manager.status,
        manager.trans
      )
    };
    renderChip(this.node, view);
    const shown = view.actions.map(a => `${a.kind}:${a.label}`).join('|');
    if (shown === this._shownActions) {
      return; // the same buttons: a rebuild would lose a click in progress
    }
    this._shownActions = shown;
    this._buttons.replaceChildren(
      ...view.actions.map(action => {
        const button = document.createElement('button');
        button.className = 'jp-JupyterPause-ChipAction';
        button.type = 'button';
        button.dataset.action = action.kind;
        button.textContent = action.label;
        button.addEventListener('click', event => {
          event.stopPropagation();
          void this._commands.execute(this._ids[action.kind]);
        });
        return button;
      })
    );
  }

  private _buttons: HTMLSpanElement;
  private _shownActions = '';
}
