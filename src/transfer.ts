/**
 * Large bodies to and from the server, with progress: a download streamed
 * into a Blob (fetch), an upload sent by XMLHttpRequest (fetch cannot report
 * how much of a request body went out). Both go through
 * `ServerConnection.makeRequest`, so they carry the same authentication as
 * every other request of JupyterLab.
 */
import { ServerConnection } from '@jupyterlab/services';

import { makeAPIRequest, readError } from './request';

/**
 * How far a transfer got.
 */
export interface ITransferProgress {
  /**
   * Bytes moved so far.
   */
  done: number;
  /**
   * Bytes in all; 0 when unknown.
   */
  total: number;
}

/**
 * Told of a transfer's progress as it goes.
 */
export type ProgressCallback = (progress: ITransferProgress) => void;

/**
 * A downloaded body.
 */
export interface IDownload {
  /**
   * The body.
   */
  blob: Blob;
  /**
   * The response (its headers; its body is read).
   */
  response: Response;
}

/**
 * Received bytes are folded into a Blob each time this many arrived, so a
 * large download does not sit in the page's memory as many small arrays (the
 * browser may keep a Blob's bytes outside the page, on disk).
 */
const FOLD_BYTES = 64 * 1024 * 1024;

/**
 * GET an end point of the jupyter_pause server extension and stream its body
 * into a Blob.
 *
 * @param endPoint REST end point below `/jupyter-pause/`.
 * @param serverSettings The server settings.
 * @param onProgress Told of the bytes received (the total from
 *   `Content-Length`).
 * @returns The body and the response.
 * @throws {ServerConnection.NetworkError} when the server cannot be reached.
 * @throws {ServerConnection.ResponseError} when the server answers with an error status.
 */
export async function download(
  endPoint: string,
  serverSettings: ServerConnection.ISettings,
  onProgress?: ProgressCallback
): Promise<IDownload> {
  const response = await makeAPIRequest(
    endPoint,
    { method: 'GET' },
    serverSettings
  );
  if (!response.ok) {
    throw await readError(response);
  }
  const total = Number(response.headers.get('Content-Length')) || 0;
  const type = response.headers.get('Content-Type') || '';
  const parts: BlobPart[] = [];
  let done = 0;
  let unfolded = 0;
  onProgress?.({ done, total });
  const reader = response.body?.getReader();
  if (!reader) {
    const buffer = await response.arrayBuffer();
    parts.push(buffer);
    done = buffer.byteLength;
  } else {
    try {
      for (;;) {
        const chunk = await reader.read();
        if (chunk.done) {
          break;
        }
        parts.push(chunk.value);
        done += chunk.value.byteLength;
        unfolded += chunk.value.byteLength;
        if (unfolded >= FOLD_BYTES) {
          parts.splice(0, parts.length, new Blob(parts));
          unfolded = 0;
        }
        onProgress?.({ done, total });
      }
    } catch (error) {
      throw new ServerConnection.NetworkError(error as TypeError);
    }
  }
  if (total && done !== total) {
    throw new ServerConnection.NetworkError(
      new TypeError(`the download stopped after ${done} of ${total} bytes`)
    );
  }
  onProgress?.({ done, total });
  return { blob: new Blob(parts, { type }), response };
}

/**
 * POST a Blob to an end point of the jupyter_pause server extension, with
 * the progress of its upload.
 *
 * @param endPoint REST end point below `/jupyter-pause/`.
 * @param body What to send.
 * @param contentType Its media type.
 * @param serverSettings The server settings.
 * @param onProgress Told of the bytes sent.
 * @returns The response, its body unread (whatever its status).
 * @throws {ServerConnection.NetworkError} when the server cannot be reached.
 */
export function upload(
  endPoint: string,
  body: Blob,
  contentType: string,
  serverSettings: ServerConnection.ISettings,
  onProgress?: ProgressCallback
): Promise<Response> {
  // makeRequest builds the request (URL, authentication headers) and hands it
  // to `fetch`: this one sends it by XMLHttpRequest instead.
  const settings: ServerConnection.ISettings = {
    ...serverSettings,
    fetch: (input: RequestInfo, init?: RequestInit) =>
      sendByXhr(new Request(input, init), body, onProgress)
  };
  return makeAPIRequest(
    endPoint,
    { method: 'POST', headers: { 'Content-Type': contentType } },
    settings
  );
}

/**
 * Send a request with `body` by XMLHttpRequest, reporting the upload's
 * progress; answers like fetch (a TypeError when nothing came back).
 */
function sendByXhr(
  request: Request,
  body: Blob,
  onProgress?: ProgressCallback
): Promise<Response> {
  return new Promise<Response>((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open(request.method, request.url);
    xhr.withCredentials = request.credentials === 'include';
    request.headers.forEach((value, name) => {
      xhr.setRequestHeader(name, value);
    });
    xhr.upload.onprogress = event => {
      onProgress?.({
        done: event.loaded,
        total: event.lengthComputable ? event.total : body.size
      });
    };
    xhr.onload = () => {
      resolve(
        new Response(nullBodyStatus(xhr.status) ? null : xhr.responseText, {
          status: xhr.status,
          statusText: xhr.statusText,
          headers: parseHeaders(xhr.getAllResponseHeaders())
        })
      );
    };
    xhr.onerror = () => {
      reject(new TypeError(`the upload to ${request.url} failed`));
    };
    xhr.onabort = () => {
      reject(new TypeError(`the upload to ${request.url} was aborted`));
    };
    onProgress?.({ done: 0, total: body.size });
    xhr.send(body);
  });
}

/**
 * Statuses whose response has no body (a Response refuses one).
 */
function nullBodyStatus(status: number): boolean {
  return status === 101 || status === 204 || status === 205 || status === 304;
}

/**
 * The headers of `getAllResponseHeaders()`.
 */
function parseHeaders(raw: string): Headers {
  const headers = new Headers();
  for (const line of raw.trim().split(/[\r\n]+/)) {
    const colon = line.indexOf(':');
    if (colon > 0) {
      headers.append(line.slice(0, colon).trim(), line.slice(colon + 1).trim());
    }
  }
  return headers;
}

/**
 * The file name of a `Content-Disposition: attachment; filename="..."`
 * header (RFC 6266, `filename*` first).
 *
 * @param header The header's value, or `null`.
 * @returns The name, or `null` when the header names none.
 */
export function attachmentName(header: string | null): string | null {
  if (!header) {
    return null;
  }
  const extended = /filename\*\s*=\s*(?:UTF-8|utf-8)''([^;]+)/.exec(header);
  if (extended) {
    try {
      return decodeURIComponent(extended[1].trim());
    } catch {
      // Not valid percent-encoding: try the plain parameter.
    }
  }
  const plain = /filename\s*=\s*("(?:[^"\\]|\\.)*"|[^;]+)/.exec(header);
  if (!plain) {
    return null;
  }
  const value = plain[1].trim();
  return value.startsWith('"')
    ? value.slice(1, -1).replace(/\\(.)/g, '$1')
    : value;
}

/**
 * Hand a Blob to the browser as a download.
 *
 * @param blob The content.
 * @param name The file name offered.
 */
export function saveBlob(blob: Blob, name: string): void {
  const url = URL.createObjectURL(blob);
  const link = document.createElement('a');
  link.href = url;
  link.download = name;
  link.style.display = 'none';
  document.body.appendChild(link);
  link.click();
  link.remove();
  // The browser reads the Blob after the click: keep it a while.
  window.setTimeout(() => URL.revokeObjectURL(url), 60 * 1000);
}
