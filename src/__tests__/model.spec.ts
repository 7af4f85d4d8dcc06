import { NotebookPanel } from '@jupyterlab/notebook';
import { ServerConnection, Session } from '@jupyterlab/services';
import { Signal } from '@lumino/signaling';

import { DEFAULT_SETTINGS, NotebookPauseModel, PauseManager } from '../model';

import { STATUS, json, server, session } from './fakes';

/** The manager never touches the session manager in these tests. */
const NO_SESSIONS = {} as Session.IManager;

/** Managers made by a test, disposed after it. */
const made: PauseManager[] = [];

function managerOf(settings: ServerConnection.ISettings): PauseManager {
  const manager = new PauseManager(settings, NO_SESSIONS);
  made.push(manager);
  return manager;
}

afterEach(() => {
  made.splice(0).forEach(manager => manager.dispose());
});

describe('PauseManager', () => {
  it('knows the server side answers, and its status', async () => {
    const { settings, calls } = server(() => json(200, STATUS));
    const manager = managerOf(settings);
    let changes = 0;
    manager.changed.connect(() => changes++);
    expect(manager.server).toBe('unknown');

    expect(await manager.checkServer()).toBe('ok');
    expect(manager.status?.resources?.gpus_total).toBe(1);
    expect(calls[0].url).toMatch(/\/jupyter-pause\/status/);
    expect(changes).toBe(1);
    // no change, no signal
    await manager.checkServer();
    expect(changes).toBe(1);
    manager.dispose();
    expect(manager.isDisposed).toBe(true);
  });

  it('says the server extension is missing when the API is not there', async () => {
    const warn = jest
      .spyOn(console, 'warn')
      .mockImplementation(() => undefined);
    const { settings } = server(() => new Response('', { status: 404 }));
    const manager = managerOf(settings);
    expect(await manager.checkServer()).toBe('missing');
    expect(await manager.checkServer()).toBe('missing');
    expect(manager.status).toBeNull();
    // the console says once what to do, not at every poll
    expect(warn).toHaveBeenCalledTimes(1);
    warn.mockRestore();
  });

  it('says the server is unreachable when nothing answers, or an error page does', async () => {
    const down = server(() =>
      Promise.reject(new TypeError('connection refused'))
    );
    expect(await managerOf(down.settings).checkServer()).toBe('unreachable');
    const broken = server(
      () => new Response('<html>oops</html>', { status: 500 })
    );
    expect(await managerOf(broken.settings).checkServer()).toBe('unreachable');
  });

  it('comes back from unreachable when the server answers again', async () => {
    let up = false;
    const { settings } = server(() =>
      up ? json(200, STATUS) : Promise.reject(new TypeError('refused'))
    );
    const manager = managerOf(settings);
    expect(await manager.checkServer()).toBe('unreachable');
    up = true;
    expect(await manager.checkServer()).toBe('ok');
    manager.markUnreachable();
    expect(manager.server).toBe('unreachable');
  });

  it('applies new settings and says so', () => {
    const { settings } = server(() => json(200, STATUS));
    const manager = managerOf(settings);
    let changes = 0;
    manager.changed.connect(() => changes++);
    expect(manager.settings).toEqual(DEFAULT_SETTINGS);
    manager.settings = { ...DEFAULT_SETTINGS, refreshIntervalSeconds: 30 };
    expect(manager.settings.refreshIntervalSeconds).toBe(30);
    expect(changes).toBe(1);
  });
});

/** What NotebookPauseModel reads of a notebook panel: its path and two signals. */
function panelOf(path: string): NotebookPanel {
  const owner = {};
  return {
    id: `panel-${path}`,
    context: {
      path,
      ready: new Promise<void>(() => undefined),
      model: { contentChanged: new Signal(owner) }
    },
    sessionContext: { connectionStatusChanged: new Signal(owner) }
  } as unknown as NotebookPanel;
}

/** Models made by a test, disposed after it. */
const models: NotebookPauseModel[] = [];

afterEach(() => {
  models.splice(0).forEach(model => model.dispose());
});

describe('NotebookPauseModel', () => {
  it('says the server stopped when a Hub answers for it after a pause', async () => {
    // The server answers "checkpointing"; then the Hub stops it and answers the polls
    // itself with its error page (424: the server is not running).
    let stopped = false;
    const { settings } = server(call => {
      if (stopped) {
        return new Response('<html>not running</html>', { status: 424 });
      }
      return call.url.endsWith('/status')
        ? json(200, STATUS)
        : json(200, session({ state: 'checkpointing' }));
    });
    const manager = managerOf(settings);
    expect(await manager.checkServer()).toBe('ok');
    const model = new NotebookPauseModel(panelOf('train.ipynb'), manager);
    models.push(model);
    await model.refresh();
    expect(model.view.label).toBe('Checkpointing');
    stopped = true;
    await model.refresh();
    expect(manager.server).toBe('unreachable');
    expect(model.view.label).toBe('Server stopped');
  });
});
