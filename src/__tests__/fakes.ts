import { ServerConnection } from '@jupyterlab/services';

import { ISession } from '../api';

/**
 * Fakes of the server side shared by the specs: what the REST API answers.
 */

export const BASE = 'http://localhost:8888/';

/** One request the fake server received. */
export interface ICall {
  method: string;
  url: string;
}

/** The server's answer to a request: a response, or a thrown network error. */
export type Answer = (call: ICall) => Response | Promise<Response>;

/**
 * Server settings whose fetch answers from `answer`, recording each request
 * (its URL without the query string).
 */
export function server(answer: Answer): {
  settings: ServerConnection.ISettings;
  calls: ICall[];
} {
  const calls: ICall[] = [];
  const settings = ServerConnection.makeSettings({
    baseUrl: BASE,
    fetch: async (
      input: RequestInfo | URL,
      init?: RequestInit
    ): Promise<Response> => {
      const request = input instanceof Request ? input : null;
      const call = {
        method: request?.method ?? init?.method ?? 'GET',
        // without the query that defeats caches of GETs
        url: (request?.url ?? String(input)).split('?')[0]
      };
      calls.push(call);
      return answer(call);
    }
  });
  return { settings, calls };
}

export function json(status: number, body: unknown): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { 'Content-Type': 'application/json' }
  });
}

/** A session JSON as the server answers it, with `fields` replaced. */
export function session(fields: Partial<ISession> = {}): ISession {
  return {
    path: 'work/model.ipynb',
    state: 'active',
    message: '',
    since: new Date(2025, 0, 2, 18, 2, 30).getTime() / 1000,
    kernel_id: 'k1',
    kernel_name: 'python3',
    gpus: [0],
    gpus_needed: 1,
    progress: null,
    how: null,
    restore: null,
    error: null,
    checkpoint: null,
    hold: null,
    warnings: [],
    queue_position: null,
    paused_during_cell: null,
    unrestored_kernel: false,
    sharing_notebooks: [],
    busy: false,
    busy_since: null,
    execution_count: 3,
    last_activity: null,
    watching: true,
    ...fields
  };
}

/** The status JSON of a server with one free GPU. */
export const STATUS = {
  version: '0.1.0',
  backend: 'local',
  resources: {
    backend: 'local',
    gpus_total: 1,
    gpus_free: 1,
    queue: [],
    details: {}
  },
  policy: { idle_pause_minutes: 0, keep_last: 3 }
};
