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
  const response = await makeAPIRequest(endPoint, init, serverSettings);
  const text = await response.text();
  if (!response.ok) {
    throw responseError(response, text);
  }
  return parseBody(text) as T;
}

/**
 * The URL of an end point of the jupyter_pause server extension.
 *
 * @param endPoint REST end point below `/jupyter-pause/`, e.g. `status`.
 * @param serverSettings The server settings to use.
 * @returns The full URL.
 */
export function apiUrl(
  endPoint: string,
  serverSettings: ServerConnection.ISettings
): string {
  return URLExt.join(serverSettings.baseUrl, API_NAMESPACE, endPoint);
}

/**
 * Send a request to the jupyter_pause server extension and answer its
 * response as it is (its body unread, whatever its status).
 *
 * @param endPoint REST end point below `/jupyter-pause/`.
 * @param init Initial values for the request.
 * @param serverSettings The server settings to use.
 * @returns The response.
 * @throws {ServerConnection.NetworkError} when the server cannot be reached.
 */
export async function makeAPIRequest(
  endPoint: string,
  init: RequestInit,
  serverSettings: ServerConnection.ISettings
): Promise<Response> {
  try {
    return await ServerConnection.makeRequest(
      apiUrl(endPoint, serverSettings),
      init,
      serverSettings
    );
  } catch (error) {
    if (error instanceof ServerConnection.NetworkError) {
      throw error;
    }
    throw new ServerConnection.NetworkError(error as TypeError);
  }
}

/**
 * The error of a response with an error status, carrying the server's
 * `message` when its body is the JSON error of jupyter_server.
 *
 * @param response The response.
 * @param text Its body, read.
 * @returns The error to throw.
 */
export function responseError(
  response: Response,
  text: string
): ServerConnection.ResponseError {
  const data = parseBody(text) as { message?: unknown } | string | null;
  const message =
    data && typeof data === 'object' && data.message
      ? String(data.message)
      : text;
  return new ServerConnection.ResponseError(response, message);
}

/**
 * Read the body of an error response and make its error.
 *
 * @param response A response with an error status, its body unread.
 * @returns The error to throw.
 */
export async function readError(
  response: Response
): Promise<ServerConnection.ResponseError> {
  let text = '';
  try {
    text = await response.text();
  } catch {
    // A body cut off: the status says enough.
  }
  return responseError(response, text);
}

/**
 * A body parsed as JSON, or the raw text when it is not JSON (e.g. an HTML
 * error page).
 */
function parseBody(text: string): unknown {
  if (text.length > 0) {
    try {
      return JSON.parse(text);
    } catch {
      // Not JSON: keep the raw text.
    }
  }
  return text;
}
