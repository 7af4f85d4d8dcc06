import { ServerConnection } from '@jupyterlab/services';

import { readError, requestAPI } from './request';
import { ProgressCallback, attachmentName, download, upload } from './transfer';

/**
 * Accelerators of the backend, as answered in `status.resources`.
 */
export interface IResources {
  /**
   * Backend name (e.g. `local`).
   */
  backend: string;
  /**
   * Accelerators the backend may hand out.
   */
  gpus_total: number;
  /**
   * Accelerators free now.
   */
  gpus_free: number;
  /**
   * Notebook paths waiting for an accelerator, first served first.
   */
  queue: string[];
  /**
   * Backend-specific details.
   */
  details: Record<string, unknown>;
}

/**
 * The admin's effective pause policy, as answered in `status.policy`.
 */
export interface IPolicy {
  /**
   * Minutes without activity before a notebook is paused; 0: never.
   */
  idle_pause_minutes: number;
  /**
   * A session is never paused automatically before it ran this long (minutes).
   */
  min_running_minutes: number;
  /**
   * How long a pause of a busy kernel waits for the cell to finish (seconds).
   */
  busy_wait_seconds: number;
  /**
   * GPUs each kernel holds while it runs.
   */
  gpus_per_kernel: number;
  /**
   * Checkpoints kept per notebook.
   */
  keep_last: number;
  /**
   * Checkpoints older than this are deleted (hours); 0: no limit.
   */
  max_age_hours: number;
  /**
   * Storage allowed per notebook (bytes); 0: no limit.
   */
  max_bytes: number;
  /**
   * What happens to variables not marked for saving (e.g. `all`).
   */
  save_unmarked: string;
  /**
   * Per-kernelspec overrides of the policy.
   */
  kernelspec_overrides: Record<string, Record<string, unknown>>;
  [key: string]: unknown;
}

/**
 * The JSON answered by `GET /jupyter-pause/status`.
 */
export interface IStatus {
  /**
   * Version of the jupyter_pause Python package running in the server.
   */
  version: string;
  /**
   * Name of the backend that pauses and resumes kernels (e.g. `local`).
   */
  backend: string;
  /**
   * Whether a resume can bring a session back without its GPUs, from files
   * (`resume(path, { onCpu: true })`).
   */
  restores_on_cpu?: boolean;
  /**
   * Accelerators and the waiting queue.
   */
  resources?: IResources;
  /**
   * The admin's effective policy.
   */
  policy?: IPolicy;
}

/**
 * The states a notebook session goes through.
 */
export type SessionState =
  | 'active'
  | 'checkpointing'
  | 'pausing'
  | 'paused'
  | 'resuming'
  | 'waiting-for-resources'
  | 'restoring'
  | 'ready'
  | 'partial'
  | 'failed';

/**
 * Progress of a checkpoint or a restore.
 */
export interface IProgress {
  /**
   * What is being done (e.g. `writing`, `starting kernel`).
   */
  phase: string;
  /**
   * Units done so far.
   */
  done: number;
  /**
   * Units in all; 0 when unknown.
   */
  total: number;
}

/**
 * What a restore from files brought back.
 */
export interface IRestoreResult {
  /**
   * The checkpoint that was restored.
   */
  checkpoint_id: string;
  /**
   * Names restored.
   */
  restored: string[];
  /**
   * Names saved but not restored, with the reason.
   */
  failed: Record<string, string>;
  /**
   * Names skipped when the checkpoint was written, with the reason.
   */
  not_saved: Record<string, string>;
  /**
   * Other things the user should know.
   */
  warnings: string[];
  /**
   * Time the restore took.
   */
  seconds: number;
  /**
   * Bytes read from storage.
   */
  bytes_read: number;
  /**
   * Variables the kernel had defined itself (it did not write the checkpoint)
   * that the restore replaced.
   */
  replaced?: string[];
  /**
   * A lazy restore: bytes handed over as maps that were still loading (and
   * being checked) when it was ready; 0 once all are in.
   */
  loading_bytes?: number;
}

/**
 * An error of the last pause or resume, with how to recover.
 */
export interface ISessionError {
  /**
   * What failed.
   */
  what: string;
  /**
   * What the user can do about it.
   */
  recovery: string;
}

/**
 * The latest checkpoint of a session.
 */
export interface ICheckpointInfo {
  /**
   * Checkpoint id.
   */
  id: string;
  /**
   * Creation time (epoch seconds).
   */
  created: number;
  /**
   * Size in bytes.
   */
  bytes: number;
  /**
   * The variables it holds.
   */
  variables?: string[];
  /**
   * Set when it lacks most variables of the checkpoint before it.
   */
  shrunk_from?: { id: number; missing: string[] };
  [key: string]: unknown;
}

/**
 * What a restore could not bring back, per checkpoint: while it is set no
 * checkpoint of the notebook is deleted, until the user accepts.
 */
export interface IRetentionHold {
  /**
   * Checkpoint id -> the names not restored from it (or, `kind: 'shrunk'`,
   * the names it holds that the newer checkpoint `newer` lacks), with why.
   */
  checkpoints: Record<
    string,
    {
      failed: Record<string, string>;
      since: number;
      kind?: 'restore' | 'shrunk';
      newer?: number;
    }
  >;
  /**
   * Set when the hold record itself could not be read.
   */
  unreadable?: string;
}

/**
 * The JSON answered by `GET /jupyter-pause/sessions/<path>`.
 */
export interface ISession {
  path: string;
  state: SessionState;
  message: string;
  /**
   * When the session entered its state (epoch seconds).
   */
  since: number;
  kernel_id: string | null;
  kernel_name: string;
  gpus: number[];
  gpus_needed: number;
  progress: IProgress | null;
  how: 'live' | 'files' | null;
  restore: IRestoreResult | null;
  error: ISessionError | null;
  checkpoint: ICheckpointInfo | null;
  /**
   * The retention hold after an incomplete restore, or `null`.
   */
  hold: IRetentionHold | null;
  /**
   * Damaged or unreadable files of this notebook, named.
   */
  warnings: string[];
  queue_position: number | null;
  /**
   * The execution count of the cell a pause stopped in its course (it runs on after a live
   * resume); `null` when the kernel was idle.
   */
  paused_during_cell: number | null;
  /**
   * True while a kernel runs for this paused notebook without its saved state
   * (the notebook was opened again, or its kernel restarted): a resume
   * restores the checkpoint into that kernel.
   */
  unrestored_kernel: boolean;
  /**
   * Other notebooks whose sessions use this session's kernel.
   */
  sharing_notebooks: string[];
  busy: boolean;
  busy_since: number | null;
  execution_count: number | null;
  last_activity: number | null;
  watching: boolean;
}

/**
 * The JSON answered by `POST /jupyter-pause/checkpoint/<path>`.
 */
export interface ICheckpointResponse {
  result: {
    checkpoint_id: string;
    saved: string[];
    skipped: Record<string, string>;
    bytes_written: number;
    bytes_reused: number;
    bytes_total: number;
    seconds: number;
  };
  session: ISession;
}

/**
 * One event of a session's timeline.
 */
export interface ITimelineEvent {
  /**
   * Event kind, e.g. `pause_requested`.
   */
  kind: string;
  /**
   * When it happened (epoch seconds).
   */
  at: number;
  /**
   * Event details.
   */
  data: Record<string, any>;
}

/**
 * GPU-seconds and latencies of a session.
 */
export interface IAccounting {
  gpus: number;
  gpu_seconds_allocated: number;
  gpu_seconds_active: number;
  gpu_seconds_released: number;
  pauses: number;
  resumes: number;
  last_resume_to_ready_seconds: number | null;
  last_resume_to_next_cell_seconds: number | null;
  bytes_saved: number;
  /**
   * Pod snapshots taken of the whole workspace (workspace backend).
   */
  snapshots?: number;
}

/**
 * The JSON answered by `GET /jupyter-pause/timeline/<path>`.
 */
export interface ITimeline {
  path: string;
  state: SessionState;
  events: ITimelineEvent[];
  accounting: IAccounting;
}

/**
 * A session file as `GET /jupyter-pause/export/<path>` answers it.
 */
export interface ISessionFile {
  /**
   * The file (an uncompressed tar).
   */
  blob: Blob;
  /**
   * Its name, e.g. `model.jpsession`.
   */
  name: string;
  /**
   * The checkpoint it holds (`X-Checkpoint-Id`), or `null` when unsaid.
   */
  checkpointId: string | null;
}

/**
 * The JSON answered by `POST /jupyter-pause/import/<path>` (201).
 */
export interface IImportResponse {
  /**
   * The imported session: paused, untrusted.
   */
  session: ISession;
  /**
   * What differs here from where the session was made (packages, Python, GPU).
   */
  differences: string[];
}

/**
 * The media type of a session file.
 */
export const SESSION_FILE_TYPE = 'application/x-tar';

/**
 * The file name extension of a session file.
 */
export const SESSION_FILE_EXTENSION = '.jpsession';

/**
 * Whether the server side answers: `ok`, `missing` (the server extension is
 * not installed: 404 on `status`) or `unreachable` (no answer at all).
 */
export type ServerAvailability = 'unknown' | 'ok' | 'missing' | 'unreachable';

/**
 * Encode a notebook path for the URL: each segment on its own.
 *
 * @param path Notebook path relative to the server root.
 * @returns The encoded path.
 */
export function encodePath(path: string): string {
  return path
    .split('/')
    .filter(segment => segment.length > 0)
    .map(encodeURIComponent)
    .join('/');
}

/**
 * The message of an error thrown by the REST calls, in words for the user.
 *
 * @param error The error.
 * @returns Its message.
 */
export function errorMessage(error: unknown): string {
  if (error instanceof ServerConnection.ResponseError) {
    return error.message || `HTTP ${error.response.status}`;
  }
  if (error instanceof ServerConnection.NetworkError) {
    return 'the server cannot be reached';
  }
  return error instanceof Error ? error.message : String(error);
}

/**
 * A typed client for the jupyter_pause REST API.
 *
 * It remembers whether the server extension answered, so the rest of the
 * frontend can disable its UI when the server side is missing or down.
 */
export class PauseClient {
  /**
   * Create a client.
   *
   * @param serverSettings The settings of the Jupyter server to talk to.
   */
  constructor(serverSettings: ServerConnection.ISettings) {
    this._serverSettings = serverSettings;
  }

  /**
   * Whether the server extension is available: `null` until the first answer.
   */
  get serverAvailable(): boolean | null {
    return this._serverAvailable;
  }

  /**
   * Fetch the server extension status.
   *
   * @returns The status, or `null` when the server extension is not installed (404).
   */
  async getStatus(): Promise<IStatus | null> {
    try {
      const status = await this._request<IStatus>('status', 'GET');
      this._serverAvailable = true;
      return status;
    } catch (error) {
      if (
        error instanceof ServerConnection.ResponseError &&
        error.response.status === 404
      ) {
        this._serverAvailable = false;
        this._warnOnce(
          'The jupyter_pause server extension is not installed or not enabled; ' +
            'pausing notebooks is unavailable.'
        );
        return null;
      }
      throw error;
    }
  }

  /**
   * Fetch the pause state of one notebook.
   *
   * @param path Notebook path relative to the server root.
   * @returns The session, or `null` when the notebook has no kernel and no checkpoint (404).
   */
  async getSession(path: string): Promise<ISession | null> {
    try {
      return await this._request<ISession>(
        `sessions/${encodePath(path)}`,
        'GET'
      );
    } catch (error) {
      if (
        error instanceof ServerConnection.ResponseError &&
        error.response.status === 404
      ) {
        return null;
      }
      throw error;
    }
  }

  /**
   * Start pausing a notebook (answers at once; follow the session's state).
   *
   * @param path Notebook path relative to the server root.
   * @returns The session.
   */
  pause(path: string): Promise<ISession> {
    return this._request<ISession>(`pause/${encodePath(path)}`, 'POST');
  }

  /**
   * Start resuming a notebook, or join the resume in flight.
   *
   * @param path Notebook path relative to the server root.
   * @param options `onCpu`: from files into a kernel without a GPU, now (a
   *   resume waiting for a GPU gives its place up).
   * @returns The session.
   */
  resume(path: string, options: { onCpu?: boolean } = {}): Promise<ISession> {
    return this._request<ISession>(
      `resume/${encodePath(path)}`,
      'POST',
      options.onCpu ? { accelerators: 'none' } : undefined
    );
  }

  /**
   * Cancel a resume that waits for resources: the notebook stays paused.
   *
   * @param path Notebook path relative to the server root.
   * @returns The session.
   */
  cancel(path: string): Promise<ISession> {
    return this._request<ISession>(`cancel/${encodePath(path)}`, 'POST');
  }

  /**
   * Carry on after an incomplete restore: old checkpoints may be deleted again.
   *
   * @param path Notebook path relative to the server root.
   * @returns The session.
   */
  accept(path: string): Promise<ISession> {
    return this._request<ISession>(`accept/${encodePath(path)}`, 'POST');
  }

  /**
   * Write a checkpoint of a running notebook now.
   *
   * @param path Notebook path relative to the server root.
   * @returns What was saved, and the session.
   */
  checkpoint(path: string): Promise<ICheckpointResponse> {
    return this._request<ICheckpointResponse>(
      `checkpoint/${encodePath(path)}`,
      'POST'
    );
  }

  /**
   * Fetch the timeline and GPU accounting of a notebook.
   *
   * @param path Notebook path relative to the server root.
   * @returns The timeline.
   */
  getTimeline(path: string): Promise<ITimeline> {
    return this._request<ITimeline>(`timeline/${encodePath(path)}`, 'GET');
  }

  /**
   * Download the session file of a notebook: its notebook and latest good
   * checkpoint (a running session is checkpointed first).
   *
   * @param path Notebook path relative to the server root.
   * @param onProgress Told of the bytes received.
   * @returns The file, its name and its checkpoint.
   */
  async exportSession(
    path: string,
    onProgress?: ProgressCallback
  ): Promise<ISessionFile> {
    const { blob, response } = await download(
      `export/${encodePath(path)}`,
      this._serverSettings,
      onProgress
    );
    const stem = (path.split('/').pop() || 'session').replace(/\.ipynb$/, '');
    return {
      blob,
      name:
        attachmentName(response.headers.get('Content-Disposition')) ||
        `${stem}${SESSION_FILE_EXTENSION}`,
      checkpointId: response.headers.get('X-Checkpoint-Id')
    };
  }

  /**
   * Upload a session file as notebook `path`: it is placed paused and
   * untrusted (see `trust`).
   *
   * @param path The new notebook's path relative to the server root (it must not exist).
   * @param file The session file.
   * @param onProgress Told of the bytes sent.
   * @returns The session and what differs here from where it was made.
   */
  async importSession(
    path: string,
    file: Blob,
    onProgress?: ProgressCallback
  ): Promise<IImportResponse> {
    const response = await upload(
      `import/${encodePath(path)}`,
      file,
      SESSION_FILE_TYPE,
      this._serverSettings,
      onProgress
    );
    if (!response.ok) {
      throw await readError(response);
    }
    return (await response.json()) as IImportResponse;
  }

  /**
   * Trust an imported session: its resume may then restore (unpickle) it.
   *
   * @param path Notebook path relative to the server root.
   * @returns The session.
   */
  trust(path: string): Promise<ISession> {
    return this._request<ISession>(`trust/${encodePath(path)}`, 'POST');
  }

  /**
   * Tell the server the user edited the notebook (activity for the idle policy).
   *
   * @param path Notebook path relative to the server root.
   */
  async noteActivity(path: string): Promise<void> {
    await this._request<unknown>(`activity/${encodePath(path)}`, 'POST');
  }

  private _request<T>(
    endPoint: string,
    method: string,
    body?: Record<string, unknown>
  ): Promise<T> {
    const init: RequestInit = { method };
    if (body !== undefined) {
      init.body = JSON.stringify(body);
    }
    return requestAPI<T>(endPoint, init, this._serverSettings);
  }

  private _warnOnce(message: string): void {
    if (!this._warned) {
      this._warned = true;
      console.warn(message);
    }
  }

  private _serverSettings: ServerConnection.ISettings;
  private _serverAvailable: boolean | null = null;
  private _warned = false;
}
