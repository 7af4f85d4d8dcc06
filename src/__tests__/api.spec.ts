import { ServerConnection } from '@jupyterlab/services';

import { PauseClient } from '../api';
import { requestAPI } from '../request';

/**
 * Server settings whose fetch answers `status` with `body` and records the URLs.
 */
function fakeServer(
  status: number,
  body: string
): { settings: ServerConnection.ISettings; urls: string[] } {
  const urls: string[] = [];
  const settings = ServerConnection.makeSettings({
    baseUrl: 'http://localhost:8888/base/',
    fetch: async (input: RequestInfo | URL): Promise<Response> => {
      urls.push(input instanceof Request ? input.url : String(input));
      return new Response(body, {
        status,
        headers: { 'Content-Type': 'application/json' }
      });
    }
  });
  return { settings, urls };
}

describe('requestAPI', () => {
  it('calls the jupyter-pause namespace and parses JSON', async () => {
    const { settings, urls } = fakeServer(200, '{"backend": "local"}');
    const data = await requestAPI<{ backend: string }>('status', {}, settings);
    expect(data.backend).toBe('local');
    expect(urls[0]).toMatch(
      /^http:\/\/localhost:8888\/base\/jupyter-pause\/status/
    );
  });

  it('throws a ResponseError carrying the server message', async () => {
    const { settings } = fakeServer(409, '{"message": "already paused"}');
    await expect(requestAPI('status', {}, settings)).rejects.toThrow(
      'already paused'
    );
  });
});

describe('PauseClient', () => {
  afterEach(() => {
    jest.restoreAllMocks();
  });

  it('reports the server available after a 200', async () => {
    const { settings } = fakeServer(
      200,
      '{"version": "0.1.0", "backend": "local"}'
    );
    const client = new PauseClient(settings);
    expect(client.serverAvailable).toBeNull();
    expect(await client.getStatus()).toEqual({
      version: '0.1.0',
      backend: 'local'
    });
    expect(client.serverAvailable).toBe(true);
  });

  it('remembers a missing server extension and warns once', async () => {
    const warn = jest
      .spyOn(console, 'warn')
      .mockImplementation(() => undefined);
    const { settings } = fakeServer(404, '');
    const client = new PauseClient(settings);
    expect(await client.getStatus()).toBeNull();
    expect(await client.getStatus()).toBeNull();
    expect(client.serverAvailable).toBe(false);
    expect(warn).toHaveBeenCalledTimes(1);
  });
});
