/**
 * The commands of session files: Export Session… (download the current
 * notebook with its saved state as one `.jpsession` file), Import Session…
 * (upload one as a new notebook, paused and untrusted) and Trust Imported
 * Session…, with the trust question the resume asks too.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import {
  Dialog,
  InputDialog,
  Notification,
  showDialog
} from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { TranslationBundle } from '@jupyterlab/translation';
import { Widget } from '@lumino/widgets';

import { SESSION_FILE_EXTENSION, errorMessage } from './api';
import { NotebookPauseModel, PauseManager } from './model';
import {
  ITrustRequest,
  cleanNotebookPath,
  defaultImportPath,
  importOrigin
} from './sessionfile';
import { ITransferProgress, saveBlob } from './transfer';
import { formatBytes } from './view';

/**
 * The command ids of session files.
 */
export const SessionFileCommandIDs = {
  /**
   * Download the current notebook and its latest checkpoint as a session file.
   */
  exportSession: 'jupyter-pause:export-session',
  /**
   * Upload a session file as a new notebook (paused, untrusted).
   */
  importSession: 'jupyter-pause:import-session',
  /**
   * Trust the imported session of the current notebook (its resume may restore it).
   */
  trustSession: 'jupyter-pause:trust-session'
} as const;

/**
 * The class of the file input an import opens (hidden; tests set its files).
 */
export const IMPORT_INPUT_CLASS = 'jp-JupyterPause-ImportInput';

/**
 * Ask whether to trust an imported session.
 *
 * @param request What the server said of the session.
 * @param trans The translation bundle.
 * @param okLabel The label of the accepting button.
 * @returns `true` when the user trusts it.
 */
export async function confirmTrust(
  request: ITrustRequest,
  trans: TranslationBundle,
  okLabel: string = trans.__('Trust and Resume')
): Promise<boolean> {
  const answer = await showDialog({
    title: trans.__('Trust this imported session?'),
    body: trustBody(request, trans),
    buttons: [
      Dialog.cancelButton({ label: trans.__('Cancel') }),
      Dialog.warnButton({ label: okLabel })
    ],
    defaultButton: 0
  });
  return answer.button.accept;
}

/**
 * The words of the trust question: who made the session, where, when, and
 * what trusting it means.
 */
function trustBody(request: ITrustRequest, trans: TranslationBundle): Widget {
  const node = document.createElement('div');
  node.className = 'jp-JupyterPause-TrustBody';
  const paragraph = (text: string) => {
    const p = document.createElement('p');
    p.textContent = text;
    node.appendChild(p);
  };
  const origin = request.origin;
  if (origin) {
    paragraph(
      trans.__(
        'It was made by %1 on %2, on %3, and imported here from a session file.',
        origin.madeBy,
        origin.madeOn,
        origin.madeAt
      )
    );
  } else {
    paragraph(
      request.message ||
        trans.__(
          'This notebook was imported from a session file, made by someone else or elsewhere.'
        )
    );
  }
  paragraph(
    trans.__(
      'Restoring it runs code from the file: its variables are unpickled, and unpickling can run any code the file holds, as you, here. Trust it only if you trust %1 and the way the file came to you.',
      origin?.madeBy ?? trans.__('whoever made it')
    )
  );
  if (origin?.differences.length) {
    paragraph(trans.__('Differs here: %1', origin.differences.join('; ')));
  }
  return new Widget({ node });
}

/**
 * `12.3 MB of 40.0 MB (30%)`, or `12.3 MB` when the total is unknown.
 *
 * @param progress How far a transfer got.
 * @param trans The translation bundle.
 * @returns The words.
 */
export function transferText(
  progress: ITransferProgress,
  trans: TranslationBundle
): string {
  if (!(progress.total > 0)) {
    return formatBytes(progress.done);
  }
  const percent = Math.min(
    100,
    Math.floor((100 * progress.done) / progress.total)
  );
  return trans.__(
    '%1 of %2 (%3%)',
    formatBytes(progress.done),
    formatBytes(progress.total),
    percent
  );
}

/**
 * How long a transfer runs before its progress is shown, and how long a shown
 * toast is left before it is changed: JupyterLab mounts a toast a moment
 * after it is emitted, and an update or dismissal that comes sooner is lost
 * (the toast keeps saying "Exporting…" for good).
 */
const TOAST_SETTLE_MS = 500;

/**
 * A notification that follows a long transfer: its bytes while it runs (when
 * it runs long enough to be worth showing), then its outcome.
 */
export class TransferNotice {
  /**
   * Start following a transfer.
   *
   * @param what What is done, e.g. `Exporting model.ipynb`.
   * @param trans The translation bundle.
   */
  constructor(
    private _what: string,
    private _trans: TranslationBundle
  ) {
    this._timer = setTimeout(() => {
      this._timer = null;
      this._emittedAt = this._shownAt = Date.now();
      this._id = Notification.emit(this._message(), 'in-progress', {
        autoClose: false,
        progress: this._fraction()
      });
    }, TOAST_SETTLE_MS);
  }

  /**
   * Show how far the transfer got (at most a few times a second).
   *
   * @param progress The bytes moved.
   */
  progress(progress: ITransferProgress): void {
    this._progress = progress;
    const now = Date.now();
    if (this._id === null || now - this._shownAt < TOAST_SETTLE_MS / 2) {
      return;
    }
    this._shownAt = now;
    Notification.update({
      id: this._id,
      message: this._message(),
      type: 'in-progress',
      autoClose: false,
      progress: this._fraction()
    });
  }

  /**
   * Show the outcome, in a notification of its own.
   *
   * @param message The words.
   * @param type How it went.
   * @param autoClose When it goes away (ms), or `false`.
   */
  end(
    message: string,
    type: 'success' | 'warning' | 'error',
    autoClose: number | false
  ): void {
    if (this._timer !== null) {
      clearTimeout(this._timer);
      this._timer = null;
    }
    const progressId = this._id;
    if (progressId !== null) {
      const wait = Math.max(0, this._emittedAt + TOAST_SETTLE_MS - Date.now());
      setTimeout(() => Notification.dismiss(progressId), wait);
    }
    Notification.emit(message, type, { autoClose });
  }

  /**
   * What the progress notification says.
   */
  private _message(): string {
    return this._progress
      ? this._trans.__(
          '%1: %2',
          this._what,
          transferText(this._progress, this._trans)
        )
      : this._what;
  }

  /**
   * How much is done (0 to 1), when the total is known.
   */
  private _fraction(): number | undefined {
    const progress = this._progress;
    return progress && progress.total > 0
      ? Math.min(1, progress.done / progress.total)
      : undefined;
  }

  private _id: string | null = null;
  private _progress: ITransferProgress | null = null;
  private _emittedAt = 0;
  private _shownAt = 0;
  private _timer: ReturnType<typeof setTimeout> | null;
}

/**
 * Let the user pick a session file (a hidden `<input type="file">`).
 *
 * @returns The file, or `null` when the picker was cancelled.
 */
function pickSessionFile(): Promise<File | null> {
  // An input left by a picker closed without a cancel event.
  document.querySelectorAll(`.${IMPORT_INPUT_CLASS}`).forEach(node => {
    node.remove();
  });
  const input = document.createElement('input');
  input.type = 'file';
  input.accept = SESSION_FILE_EXTENSION;
  input.className = IMPORT_INPUT_CLASS;
  input.style.display = 'none';
  document.body.appendChild(input);
  return new Promise<File | null>(resolve => {
    const settle = (file: File | null) => {
      input.remove();
      resolve(file);
    };
    input.addEventListener('change', () => settle(input.files?.[0] ?? null), {
      once: true
    });
    input.addEventListener('cancel', () => settle(null), { once: true });
    input.click();
  });
}

/**
 * What the session files need of the default file browser: its node (files
 * are dropped on it), the folder it shows, and its upload of other files.
 */
export interface IFileBrowserLike {
  id: string;
  node: HTMLElement;
  model?: { path?: unknown; upload?: (file: File) => Promise<unknown> };
}

/**
 * The default file browser, found by its id in the left area (no dependency
 * on the file browser package), or `null`.
 */
export function findFileBrowser(app: JupyterFrontEnd): IFileBrowserLike | null {
  const shell = app.shell as Partial<JupyterFrontEnd.IShell>;
  if (typeof shell.widgets !== 'function') {
    return null;
  }
  for (const widget of shell.widgets('left')) {
    if (widget.id === 'filebrowser') {
      return widget as unknown as IFileBrowserLike;
    }
  }
  return null;
}

/**
 * The folder the default file browser shows, or `''` (the server root).
 */
function fileBrowserDirectory(app: JupyterFrontEnd): string {
  const path = findFileBrowser(app)?.model?.path;
  // A path of another drive says so before a colon: not the server's files.
  return typeof path === 'string' && !path.includes(':') ? path : '';
}

/**
 * Import the session files dropped on the file browser instead of uploading
 * them as plain files; the other files of the same drop upload as usual.
 *
 * @param browser The file browser.
 * @param importFile Imports one session file (asks where, as Import Session… does).
 * @returns A function that stops listening.
 */
export function importDroppedSessions(
  browser: IFileBrowserLike,
  importFile: (file: File) => Promise<void>
): () => void {
  const onDrop = (event: DragEvent) => {
    const files = Array.from(event.dataTransfer?.files ?? []);
    const sessions = files.filter(file =>
      file.name.endsWith(SESSION_FILE_EXTENSION)
    );
    if (sessions.length === 0) {
      return;
    }
    // Captured before the listing's own upload sees it.
    event.preventDefault();
    event.stopPropagation();
    browser.node.querySelectorAll('.jp-mod-dropTarget').forEach(node => {
      node.classList.remove('jp-mod-dropTarget');
    });
    for (const file of files) {
      if (!sessions.includes(file)) {
        void browser.model?.upload?.(file);
      }
    }
    void (async () => {
      for (const file of sessions) {
        await importFile(file);
      }
    })();
  };
  browser.node.addEventListener('drop', onDrop, true);
  return () => browser.node.removeEventListener('drop', onDrop, true);
}

/**
 * The last path segment of a notebook path.
 */
function baseName(path: string): string {
  return path.split('/').pop() || path;
}

/**
 * Register the commands of session files.
 *
 * @param app The application.
 * @param manager The shared manager.
 * @param tracker The notebook tracker.
 * @param trans The translation bundle.
 */
export function addSessionFileCommands(
  app: JupyterFrontEnd,
  manager: PauseManager,
  tracker: INotebookTracker,
  trans: TranslationBundle
): void {
  const { commands } = app;
  const noArgs = {
    args: { type: 'object' as const, properties: {} }
  };
  const current = (): NotebookPauseModel | null => {
    const panel = tracker.currentWidget;
    return panel ? manager.modelFor(panel) : null;
  };

  commands.addCommand(SessionFileCommandIDs.exportSession, {
    label: trans.__('Export Session…'),
    caption: trans.__(
      'Download this notebook and its saved kernel state as one %1 file, to import on another server (a running kernel is checkpointed first)',
      SESSION_FILE_EXTENSION
    ),
    describedBy: noArgs,
    isEnabled: () => {
      const view = current()?.view;
      return (
        !!view &&
        (view.canCheckpoint ||
          view.state === 'paused' ||
          view.state === 'failed')
      );
    },
    execute: async () => {
      const model = current();
      if (!model) {
        return;
      }
      const path = model.path;
      const context = model.panel.context;
      if (context.model?.dirty) {
        // The file on disk is what is exported.
        await context.save().catch(() => undefined);
      }
      const notice = new TransferNotice(
        trans.__('Exporting %1', baseName(path)),
        trans
      );
      try {
        const file = await manager.client.exportSession(path, progress =>
          notice.progress(progress)
        );
        saveBlob(file.blob, file.name);
        notice.end(
          file.checkpointId
            ? trans.__(
                'Exported %1 (checkpoint %2, %3)',
                file.name,
                file.checkpointId,
                formatBytes(file.blob.size)
              )
            : trans.__(
                'Exported %1 (%2)',
                file.name,
                formatBytes(file.blob.size)
              ),
          'success',
          5000
        );
      } catch (error) {
        notice.end(
          trans.__('Cannot export %1: %2', path, errorMessage(error)),
          'error',
          8000
        );
      }
      await model.refresh();
    }
  });

  /**
   * Import one session file: ask where its notebook goes, upload it, say
   * what differs here, and open the notebook (paused, untrusted).
   */
  const importFile = async (file: File): Promise<void> => {
    const proposed = defaultImportPath(file.name, fileBrowserDirectory(app));
    const answer = await InputDialog.getText({
      title: trans.__('Import Session'),
      label: trans.__(
        'Path of the new notebook (from the root of the server):'
      ),
      text: proposed,
      // The name without `.ipynb` is selected, ready to be typed over.
      selectionRange: proposed.length - '.ipynb'.length,
      okLabel: trans.__('Import'),
      cancelLabel: trans.__('Cancel'),
      required: true
    });
    if (!answer.button.accept || !answer.value) {
      return;
    }
    const path = cleanNotebookPath(answer.value);
    const notice = new TransferNotice(
      trans.__('Importing %1 as %2', file.name, path),
      trans
    );
    let imported;
    try {
      imported = await manager.client.importSession(path, file, progress =>
        notice.progress(progress)
      );
    } catch (error) {
      notice.end(
        trans.__('Cannot import %1: %2', file.name, errorMessage(error)),
        'error',
        false
      );
      return;
    }
    const origin = importOrigin(imported.session.message);
    if (origin) {
      manager.noteUntrustedImport(path, {
        ...origin,
        differences: imported.differences
      });
    }
    const differences = imported.differences;
    notice.end(
      differences.length
        ? trans.__(
            'Imported %1, paused: Resume asks you to trust it first. Differs here: %2',
            path,
            differences.join('; ')
          )
        : trans.__(
            'Imported %1, paused: Resume asks you to trust it first.',
            path
          ),
      differences.length ? 'warning' : 'success',
      differences.length ? false : 8000
    );
    await commands.execute('docmanager:open', { path });
  };

  commands.addCommand(SessionFileCommandIDs.importSession, {
    label: trans.__('Import Session…'),
    caption: trans.__(
      'Open a %1 file as a new notebook: paused, and restored only once you trust it',
      SESSION_FILE_EXTENSION
    ),
    describedBy: noArgs,
    isEnabled: () => manager.server === 'ok' || manager.server === 'unknown',
    execute: async () => {
      const file = await pickSessionFile();
      if (file) {
        await importFile(file);
      }
    }
  });

  // Session files dropped on the file browser are imported, not uploaded.
  void app.restored?.then(() => {
    const browser = findFileBrowser(app);
    if (browser) {
      importDroppedSessions(browser, importFile);
    }
  });

  commands.addCommand(SessionFileCommandIDs.trustSession, {
    label: trans.__('Trust Imported Session…'),
    caption: trans.__(
      'Trust the session imported into this notebook: its resume may then restore it (restoring runs code from the file)'
    ),
    describedBy: noArgs,
    isEnabled: () => current()?.view.state === 'paused',
    execute: async () => {
      const model = current();
      if (!model) {
        return;
      }
      const origin = model.untrustedImport;
      const trusted = await confirmTrust(
        { origin, message: '' },
        trans,
        trans.__('Trust')
      );
      if (!trusted) {
        return;
      }
      try {
        const session = await manager.client.trust(model.path);
        manager.forgetImport(model.path);
        model.setSession(session);
        Notification.success(
          trans.__(
            'Trusted: Resume restores %1 from files.',
            baseName(model.path)
          ),
          { autoClose: 5000 }
        );
      } catch (error) {
        Notification.error(trans.__('Cannot trust: %1', errorMessage(error)), {
          autoClose: 8000
        });
      }
    }
  });

  const notify = () => commands.notifyCommandChanged();
  manager.changed.connect(notify);
  tracker.currentChanged.connect(notify);
}
