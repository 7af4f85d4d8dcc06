import { NotebookPanel } from '@jupyterlab/notebook';
import { Kernel, ServerConnection, Session } from '@jupyterlab/services';
import { TranslationBundle, nullTranslator } from '@jupyterlab/translation';
import { IDisposable } from '@lumino/disposable';
import { IPoll, Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import {
  ISession,
  IStatus,
  PauseClient,
  ServerAvailability,
  errorMessage
} from './api';
import { IImportOrigin, importOrigin, importState } from './sessionfile';
import { IPauseView, inFlight, sessionView } from './view';

/**
 * The user preferences of `schema/plugin.json`.
 */
export interface IPauseSettings {
  confirmBeforePause: boolean;
  showStatusBarItem: boolean;
  refreshIntervalSeconds: number;
  reportEditsAsActivity: boolean;
  autoResumeOnOpen: boolean;
}

/**
 * The defaults of `schema/plugin.json` (used when the registry is absent).
 */
export const DEFAULT_SETTINGS: IPauseSettings = {
  confirmBeforePause: true,
  showStatusBarItem: true,
  refreshIntervalSeconds: 5,
  reportEditsAsActivity: true,
  autoResumeOnOpen: false
};

/**
 * Poll interval while a pause or resume is in flight (ms).
 */
const FAST_INTERVAL = 1000;
/**
 * Longest interval of the poll's backoff on errors (ms).
 */
const MAX_INTERVAL = 60 * 1000;
/**
 * Edits are reported as activity at most this often (ms).
 */
const ACTIVITY_THROTTLE = 60 * 1000;

/**
 * The state shared by every notebook: the client, the server's availability
 * and policy, and the user preferences.
 */
export class PauseManager implements IDisposable {
  /**
   * Create the manager.
   *
   * @param serverSettings Settings of the Jupyter server.
   * @param sessions The session manager (to reconnect panels after a resume).
   * @param trans The translation bundle of everything the UI shows.
   */
  constructor(
    serverSettings: ServerConnection.ISettings,
    readonly sessions: Session.IManager,
    readonly trans: TranslationBundle = nullTranslator.load('jupyter_pause')
  ) {
    this.client = new PauseClient(serverSettings);
  }

  /**
   * The REST client.
   */
  readonly client: PauseClient;

  /**
   * Whether the server side answers.
   */
  get server(): ServerAvailability {
    return this._server;
  }

  /**
   * The last status answered by the server (its policy and resources).
   */
  get status(): IStatus | null {
    return this._status;
  }

  /**
   * The user preferences.
   */
  get settings(): IPauseSettings {
    return this._settings;
  }

  set settings(value: IPauseSettings) {
    this._settings = value;
    for (const model of this._models.values()) {
      model.applyInterval();
    }
    this._changed.emit(undefined);
  }

  /**
   * Emitted when the availability, the settings or any notebook's state changes.
   */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /**
   * Whether the manager is disposed.
   */
  get isDisposed(): boolean {
    return this._isDisposed;
  }

  /**
   * Ask the server for its status; updates `server` and `status`.
   *
   * @returns The availability.
   */
  async checkServer(): Promise<ServerAvailability> {
    try {
      const status = await this.client.getStatus();
      this._status = status;
      this._setServer(status ? 'ok' : 'missing');
    } catch {
      // No answer, or an error page: either way nothing can be paused now.
      this._setServer('unreachable');
    }
    return this._server;
  }

  /**
   * Record that a request could not reach the server.
   */
  markUnreachable(): void {
    this._setServer('unreachable');
  }

  /**
   * The model of a notebook panel, created on first use and disposed with the panel.
   *
   * @param panel A notebook panel.
   * @returns Its model.
   */
  modelFor(panel: NotebookPanel): NotebookPauseModel {
    let model = this._models.get(panel);
    if (!model) {
      const created = new NotebookPauseModel(panel, this);
      this._models.set(panel, created);
      created.changed.connect(() => this._changed.emit(undefined));
      panel.disposed.connect(() => {
        this._models.delete(panel);
        created.dispose();
      });
      model = created;
    }
    return model;
  }

  /**
   * Where an imported session of this page came from, while it is not trusted.
   *
   * The server's session message names the origin only until a kernel is
   * started for the notebook (opening it starts one): the page remembers it
   * from the import, or from the server's words, until the session is trusted
   * or runs.
   *
   * @param path Notebook path relative to the server root.
   * @returns The origin, or `null` when no untrusted import is known.
   */
  untrustedImport(path: string): IImportOrigin | null {
    return this._untrustedImports.get(path) ?? null;
  }

  /**
   * Remember that a notebook's session is an untrusted import.
   *
   * @param path Notebook path relative to the server root.
   * @param origin Where it came from.
   */
  noteUntrustedImport(path: string, origin: IImportOrigin): void {
    const known = this._untrustedImports.get(path);
    if (JSON.stringify(known) === JSON.stringify(origin)) {
      return;
    }
    this._untrustedImports.set(path, origin);
    this._changed.emit(undefined);
  }

  /**
   * Forget an untrusted import (it was trusted, or its session runs).
   *
   * @param path Notebook path relative to the server root.
   */
  forgetImport(path: string): void {
    if (this._untrustedImports.delete(path)) {
      this._changed.emit(undefined);
    }
  }

  /**
   * Dispose the manager and every model.
   */
  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    for (const model of this._models.values()) {
      model.dispose();
    }
    this._models.clear();
    Signal.clearData(this);
  }

  private _setServer(value: ServerAvailability): void {
    if (value !== this._server) {
      this._server = value;
      this._changed.emit(undefined);
    }
  }

  private _server: ServerAvailability = 'unknown';
  private _status: IStatus | null = null;
  private _settings: IPauseSettings = { ...DEFAULT_SETTINGS };
  private _changed = new Signal<this, void>(this);
  private _models = new Map<NotebookPanel, NotebookPauseModel>();
  private _untrustedImports = new Map<string, IImportOrigin>();
  private _isDisposed = false;
}

/**
 * The pause state of one notebook panel, kept fresh by a poll.
 */
export class NotebookPauseModel implements IDisposable {
  /**
   * Create the model and start polling.
   *
   * @param panel The notebook panel.
   * @param manager The shared manager.
   */
  constructor(
    readonly panel: NotebookPanel,
    readonly manager: PauseManager
  ) {
    this._poll = new Poll({
      factory: () => this._fetch(),
      frequency: this._frequency(),
      name: `jupyter-pause:${panel.id}`,
      standby: 'when-hidden'
    });
    void panel.context.ready.then(() => {
      if (!this.isDisposed) {
        panel.context.model.contentChanged.connect(
          this._onContentChanged,
          this
        );
      }
    });
    panel.sessionContext.connectionStatusChanged.connect(
      this._onConnectionStatusChanged,
      this
    );
  }

  /**
   * The notebook path relative to the server root.
   */
  get path(): string {
    return this.panel.context.path;
  }

  /**
   * The last session answered by the server (`null`: none, or not known yet).
   */
  get session(): ISession | null {
    return this._session;
  }

  /**
   * Where the session came from when it is an import not trusted yet, else `null`.
   */
  get untrustedImport(): IImportOrigin | null {
    return this.manager.untrustedImport(this.path);
  }

  /**
   * What to show now.
   */
  get view(): IPauseView {
    return sessionView(
      this._loaded || this.manager.server !== 'ok' ? this._session : null,
      this._loaded || this.manager.server !== 'ok'
        ? this.manager.server
        : 'unknown',
      this.manager.trans,
      {
        restoresOnCpu: this.manager.status?.restores_on_cpu ?? false,
        untrustedImport: this.untrustedImport
      }
    );
  }

  /**
   * Emitted when the session or the view changes.
   */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /**
   * Whether the model is disposed.
   */
  get isDisposed(): boolean {
    return this._isDisposed;
  }

  /**
   * Fetch the state now (e.g. after an action).
   */
  async refresh(): Promise<void> {
    await this._poll.refresh();
    await this._poll.tick;
  }

  /**
   * Take a session answered by an action (pause, resume, checkpoint).
   *
   * @param session The session.
   */
  setSession(session: ISession): void {
    this._loaded = true;
    this._set(session);
    if (inFlight(session) && !this._poll.isDisposed) {
      // Follow the transition from now on, not from the next regular tick.
      void this._poll.schedule({ interval: FAST_INTERVAL, phase: 'refreshed' });
    }
  }

  /**
   * Use the interval fitting the current state and preferences.
   */
  applyInterval(): void {
    if (!this._poll.isDisposed) {
      this._poll.frequency = this._frequency();
    }
  }

  /**
   * Stop polling and listening.
   */
  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    this._poll.dispose();
    Signal.clearData(this);
  }

  private _frequency(): IPoll.Frequency {
    const interval = inFlight(this._session)
      ? FAST_INTERVAL
      : Math.max(1, this.manager.settings.refreshIntervalSeconds) * 1000;
    return { interval, backoff: true, max: MAX_INTERVAL };
  }

  private async _fetch(): Promise<void> {
    if (this.manager.server !== 'ok') {
      const server = await this.manager.checkServer();
      if (server !== 'ok') {
        this._changed.emit(undefined);
        if (server === 'unreachable') {
          throw new Error('jupyter-pause: the server is unreachable');
        }
        return;
      }
    }
    let session: ISession | null;
    try {
      session = await this.manager.client.getSession(this.path);
    } catch (error) {
      if (error instanceof ServerConnection.NetworkError) {
        this.manager.markUnreachable();
      } else {
        // An error page instead of an answer: a Hub answers for a server it has stopped
        // (424, 503) and a proxy for a pod that is gone (502). The status tells those
        // apart from an answer of ours.
        await this.manager.checkServer();
      }
      this._changed.emit(undefined);
      throw error; // the poll backs off
    }
    const first = !this._loaded;
    this._loaded = true;
    this._set(session);
    if (
      first &&
      session?.state === 'paused' &&
      this.manager.settings.autoResumeOnOpen &&
      // An untrusted import waits for the user's trust.
      !this.untrustedImport
    ) {
      try {
        this._set(await this.manager.client.resume(this.path));
      } catch (error) {
        console.warn(
          `jupyter-pause: automatic resume failed: ${errorMessage(error)}`
        );
      }
    }
  }

  private _set(session: ISession | null): void {
    const before = JSON.stringify(this._session);
    this._session = session;
    this._noteImport(session);
    if (session?.state === 'paused') {
      // A live resume brings the same kernel id back: reconnect to it again then.
      this._reconnectedTo = null;
      this._forgetStoppedKernel(session);
    }
    this.applyInterval();
    if (JSON.stringify(session) !== before) {
      this._changed.emit(undefined);
    }
    void this._reconnect();
    this._askKernelStatus();
  }

  /**
   * Keep the manager's record of an untrusted import in step with the
   * session: learnt from its message, forgotten once trusted or running (an
   * untrusted import is never resumed).
   */
  private _noteImport(session: ISession | null): void {
    if (!session) {
      return;
    }
    const state = importState(session);
    const origin = state === 'untrusted' ? importOrigin(session.message) : null;
    if (origin && session.state === 'paused') {
      this.manager.noteUntrustedImport(this.path, origin);
    } else if (state === 'trusted' || session.state !== 'paused') {
      this.manager.forgetImport(this.path);
    }
  }

  /**
   * After a resume the server runs a new kernel in a new jupyter session:
   * connect the panel to it.
   */
  private async _reconnect(): Promise<void> {
    const session = this._session;
    if (
      !session ||
      // A partial restore runs a new kernel too: the notebook must use it.
      (session.state !== 'ready' && session.state !== 'partial') ||
      !session.kernel_id ||
      this._reconnecting
    ) {
      return;
    }
    const context = this.panel.sessionContext;
    const current = context.session?.kernel?.id;
    if (
      current === session.kernel_id ||
      this._reconnectedTo === session.kernel_id
    ) {
      return;
    }
    this._reconnecting = true;
    this._reconnectedTo = session.kernel_id;
    try {
      // Drop the session of the stopped kernel before connecting to the new one.
      await this.manager.sessions.refreshRunning();
      await context.changeKernel({ id: session.kernel_id });
    } catch (error) {
      console.warn(
        `jupyter-pause: could not reconnect ${this.path} to its resumed kernel: ` +
          errorMessage(error)
      );
    } finally {
      this._reconnecting = false;
    }
  }

  /**
   * The panel's kernel websocket connects, or closes. A status request sent on
   * a websocket the server was closing is lost (the browser drops it, and
   * JupyterLab never settles its future): the next connection asks again.
   */
  private _onConnectionStatusChanged(): void {
    this._askingStatusOf = null;
    this._askKernelStatus();
  }

  /**
   * A notebook reconnected to its resumed kernel (a kernel pod's resume closes
   * its websocket: server/kernel_connections.py) shows the kernel "unknown"
   * until the kernel's next message that JupyterLab counts: it skips the status
   * of its own kernel_info request (jupyter-server's untracked_message_types).
   * An empty is_complete request runs nothing and is answered with a status it
   * counts.
   */
  private _askKernelStatus(): void {
    const session = this._session;
    const kernel = this.panel.sessionContext.session?.kernel;
    if (
      !session ||
      (session.state !== 'ready' && session.state !== 'partial') ||
      !kernel ||
      kernel.id !== session.kernel_id ||
      kernel.connectionStatus !== 'connected' ||
      kernel.status !== 'unknown' ||
      this._askingStatusOf === kernel
    ) {
      return;
    }
    this._askingStatusOf = kernel;
    kernel
      .requestIsComplete({ code: '' })
      .catch(() => {
        // A kernel that went meanwhile: its next connection asks again.
      })
      .finally(() => {
        this._askingStatusOf = null;
      });
  }

  /**
   * The pause stopped the panel's kernel and its jupyter session ended: make
   * JupyterLab notice now (its own poll takes up to 10 s), so that the panel
   * shows no kernel and Restart Kernel starts a new one instead of asking the
   * stopped one (which answers 404).
   */
  private _forgetStoppedKernel(session: ISession): void {
    const kernel = this.panel.sessionContext.session?.kernel;
    if (
      session.kernel_id !== null ||
      !kernel ||
      this._forgotten === kernel.id
    ) {
      return;
    }
    this._forgotten = kernel.id;
    this.manager.sessions.refreshRunning().catch(() => {
      // JupyterLab's own poll does it later.
    });
  }

  private _onContentChanged(): void {
    if (
      !this.manager.settings.reportEditsAsActivity ||
      this.manager.server !== 'ok'
    ) {
      return;
    }
    const now = Date.now();
    if (now - this._lastActivity < ACTIVITY_THROTTLE) {
      return;
    }
    this._lastActivity = now;
    this.manager.client.noteActivity(this.path).catch(() => {
      // The server knows no session for this notebook yet: nothing to count.
    });
  }

  private _session: ISession | null = null;
  private _askingStatusOf: Kernel.IKernelConnection | null = null;
  private _loaded = false;
  private _poll: Poll;
  private _changed = new Signal<this, void>(this);
  private _isDisposed = false;
  private _reconnecting = false;
  private _reconnectedTo: string | null = null;
  private _forgotten: string | null = null;
  private _lastActivity = 0;
}
