import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/**
 * The REST namespace of the jupyter_pause server extension.
 */
export const API_NAMESPACE = 'jupyter-pause';

/**
 * Call the jupyter_pause server extension.
 *
 * @param endPoint REST end point below `/jupyter-pause/`, e.g. `status`.
 * @param init Initial values for the request (method, body, ...).
 * @param serverSettings The server settings to use; defaults to the page's settings.
 * @returns The response body parsed as JSON (or the raw text when it is not JSON).
 * @throws {ServerConnection.NetworkError} when the server cannot be reached.
 * @throws {ServerConnection.ResponseError} when the server answers with an error status.
 */
export async function requestAPI<T>(
  endPoint = '',
  init: RequestInit = {},
  serverSettings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<T> {
  const requestUrl = URLExt.join(
    serverSettings.baseUrl,
    API_NAMESPACE,
    endPoint
  );

  let response: Response;
  try {
    response = await ServerConnection.makeRequest(
      requestUrl,
      init,
      serverSettings
    );
  } catch (error) {
    throw new ServerConnection.NetworkError(error as TypeError);
  }

  const text = await response.text();
  let data: any = text;
  if (text.length > 0) {
    try {
      data = JSON.parse(text);
    } catch {
      // Not JSON (e.g. an HTML error page): keep the raw text.
    }
  }

  if (!response.ok) {
    throw new ServerConnection.ResponseError(
      response,
      (data && data.message) || text
    );
  }

  return data as T;
}
