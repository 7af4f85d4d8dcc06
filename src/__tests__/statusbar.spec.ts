import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { Session } from '@jupyterlab/services';
import { nullTranslator } from '@jupyterlab/translation';
import { Signal } from '@lumino/signaling';

import { PauseManager } from '../model';
import { backendMode, backendProblem, pauseConsequence } from '../backendnotes';
import { PauseStatusItem } from '../statusbar';

import { STATUS, json, server, session } from './fakes';

const PATH = 'work/model.ipynb';

/** The status of a server whose criu backend found no criu binary. */
const CRIU_WITHOUT_CRIU = {
  ...STATUS,
  backend: 'criu',
  resources: {
    ...STATUS.resources,
    backend: 'criu',
    details: {
      process_snapshots: null,
      problem: "no criu binary at '/opt/criu'",
      fallback:
        'pauses checkpoint and stop idle kernels, and resume them from their checkpoints'
    }
  }
};

/** A light notebook panel: what the manager's model uses of it. */
function fakePanel(): NotebookPanel {
  return {
    id: 'panel-1',
    context: {
      path: PATH,
      ready: Promise.resolve(),
      model: { contentChanged: new Signal<object, void>({}) }
    },
    disposed: new Signal<object, void>({}),
    sessionContext: {
      session: { kernel: { id: 'k1' } },
      connectionStatusChanged: new Signal<object, string>({})
    }
  } as unknown as NotebookPanel;
}

const cleanups: (() => void)[] = [];

afterEach(() => {
  cleanups.splice(0).forEach(cleanup => cleanup());
});

/** The status bar item of a notebook on a server answering `status`. */
async function itemOn(status: unknown): Promise<HTMLElement> {
  const { settings } = server(call =>
    call.url.endsWith('/jupyter-pause/status')
      ? json(200, status)
      : json(200, session({ path: PATH }))
  );
  const manager = new PauseManager(settings, {} as Session.IManager);
  const tracker = {
    currentWidget: fakePanel(),
    currentChanged: new Signal<object, void>({})
  };
  const item = new PauseStatusItem(
    manager,
    tracker as unknown as INotebookTracker
  );
  cleanups.push(() => {
    item.dispose();
    manager.dispose();
  });
  await manager.checkServer();
  return item.node.querySelector('.jp-JupyterPause-StatusChip') as HTMLElement;
}

describe('PauseStatusItem', () => {
  it('says in its tooltip that the criu backend falls back, and why', async () => {
    const chip = await itemOn(CRIU_WITHOUT_CRIU);
    expect(chip.title).toContain(
      "The criu backend cannot work fully here: no criu binary at '/opt/criu'; " +
        'pauses checkpoint and stop idle kernels, and resume them from their checkpoints.'
    );
  });

  it('adds nothing to the tooltip when the backend works', async () => {
    const chip = await itemOn(STATUS);
    expect(chip.title).not.toContain('cannot work fully here');
  });
});

describe('backendProblem', () => {
  const trans = nullTranslator.load('jupyter_pause');
  const statusOf = (backend: string, details: Record<string, unknown>) => ({
    version: '0.1.0',
    backend,
    resources: { backend, gpus_total: 0, gpus_free: 0, queue: [], details }
  });

  it('names the problem without a fallback when the backend gives none', () => {
    const status = statusOf('workspace', {
      problem: 'the API server cannot be reached'
    });
    expect(backendProblem(status, trans)).toBe(
      'The workspace backend cannot work fully here: the API server cannot be reached.'
    );
  });

  it('is null without a status or a problem', () => {
    expect(backendProblem(null, trans)).toBeNull();
    expect(backendProblem(statusOf('local', {}), trans)).toBeNull();
    expect(
      backendProblem(statusOf('criu', { problem: null }), trans)
    ).toBeNull();
  });
});

describe('backendMode', () => {
  const trans = nullTranslator.load('jupyter_pause');
  const statusOf = (details: Record<string, unknown>) => ({
    version: '0.1.0',
    backend: 'workspace',
    resources: {
      backend: 'workspace',
      gpus_total: 1,
      gpus_free: 0,
      queue: [],
      details
    }
  });

  it('names how a pause snapshots the pod, and why', () => {
    expect(
      backendMode(
        statusOf({
          mode: 'no-snapshots',
          mode_reason: 'the pod does not run in GKE Sandbox'
        }),
        trans
      )
    ).toBe(
      'A pause here: no pod snapshot (the checkpoints only; the resume restores from files). the pod does not run in GKE Sandbox.'
    );
    expect(backendMode(statusOf({ mode: 'gke-workspaces' }), trans)).toBe(
      'A pause here: GKE Workspaces (the snapshot add-on snapshots the pod).'
    );
    expect(backendMode(statusOf({ mode: 'jupyterhub' }), trans)).toBe(
      'A pause here: the Hub stops this server and its GPU goes back (no memory snapshot: the resume restores from files).'
    );
  });

  it('is null on a backend without modes', () => {
    expect(backendMode(statusOf({}), trans)).toBeNull();
    expect(backendMode(null, trans)).toBeNull();
  });

  it('says in the pause confirmation that the Hub stops the whole server', () => {
    const hub = pauseConsequence(
      'a.ipynb',
      statusOf({ mode: 'jupyterhub' }),
      trans
    );
    expect(hub).toContain('every other notebook running in this server');
    expect(hub).toContain('Start My Server');
    const local = pauseConsequence('a.ipynb', null, trans);
    expect(local).toContain('its kernel is stopped');
    expect(local).not.toContain('whole server');
  });
});
