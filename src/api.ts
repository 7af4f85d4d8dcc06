import { ServerConnection } from '@jupyterlab/services';

import { requestAPI } from './request';

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
}

/**
 * A typed client for the jupyter_pause REST API.
 *
 * It remembers whether the server extension answered, so the rest of the
 * frontend can hide its UI when the server side is not installed.
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
      const status = await requestAPI<IStatus>(
        'status',
        { method: 'GET' },
        this._serverSettings
      );
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
