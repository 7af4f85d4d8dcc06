import { JupyterFrontEnd } from '@jupyterlab/application';
import {
  MainAreaWidget,
  Notification,
  WidgetTracker
} from '@jupyterlab/apputils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { ServerConnection, Session } from '@jupyterlab/services';
import { acceptDialog, dismissDialog } from '@jupyterlab/testing/lib/common';
import { nullTranslator } from '@jupyterlab/translation';
import { CommandRegistry } from '@lumino/commands';
import { Signal } from '@lumino/signaling';

import { ICheckpointResponse, ISession, ITimeline } from '../api';
import { CommandIDs, addCommands } from '../commands';
import { pauseIcon, resumeIcon } from '../icons';
import { DEFAULT_SETTINGS, NotebookPauseModel, PauseManager } from '../model';
import { TimelinePanel } from '../timeline';

import {
  BASE,
  ICall,
  STATUS,
  json,
  server,
  session as sessionAt
} from './fakes';

const PATH = 'work/my model.ipynb';
/** `PATH` as the REST URLs carry it. */
const ENCODED = 'work/my%20model.ipynb';

/** A session of the notebook at `PATH`, with `fields` replaced. */
const session = (fields: Partial<ISession> = {}): ISession =>
  sessionAt({ path: PATH, ...fields });

const TIMELINE: ITimeline = {
  path: PATH,
  state: 'active',
  events: [],
  accounting: {
    gpus: 1,
    gpu_seconds_allocated: 0,
    gpu_seconds_active: 0,
    gpu_seconds_released: 0,
    pauses: 0,
    resumes: 0,
    last_resume_to_ready_seconds: null,
    last_resume_to_next_cell_seconds: null,
    bytes_saved: 0
  }
};

/**
 * A fake server: `status` answers 200, the session GET answers `state.session`
 * (404 when `null`), and POSTs answer what `state.post` says.
 */
function fakeServer(
  state: {
    session: ISession | null;
    post?: (call: ICall) => Response;
    status?: number;
  } = { session: session() }
) {
  return server(call => {
    const url = call.url;
    if (url.endsWith('/jupyter-pause/status')) {
      return state.status && state.status !== 200
        ? new Response('', { status: state.status })
        : json(200, STATUS);
    }
    if (call.method === 'GET' && url.includes('/jupyter-pause/sessions/')) {
      return state.session
        ? json(200, state.session)
        : new Response('', { status: 404 });
    }
    if (call.method === 'GET' && url.includes('/jupyter-pause/timeline/')) {
      return json(200, TIMELINE);
    }
    if (call.method === 'POST' && state.post) {
      return state.post(call);
    }
    return new Response('', { status: 404 });
  });
}

/** A light notebook panel: what the model and the commands use of it. */
function fakePanel(path = PATH, kernelId = 'k1') {
  const panel = {
    id: `panel-${path}`,
    context: {
      path,
      ready: Promise.resolve(),
      model: { contentChanged: new Signal<object, void>({}) }
    },
    disposed: new Signal<object, void>({}),
    sessionContext: {
      session: {
        kernel: {
          id: kernelId,
          status: 'idle',
          connectionStatus: 'connected',
          requestIsComplete: jest.fn().mockResolvedValue({})
        }
      },
      connectionStatusChanged: new Signal<object, string>({}),
      changeKernel: jest.fn().mockResolvedValue(null)
    }
  };
  return panel;
}

type FakePanel = ReturnType<typeof fakePanel>;

const asPanel = (panel: FakePanel) => panel as unknown as NotebookPanel;

/** Everything a command test needs, disposed after the test. */
interface IHarness {
  app: JupyterFrontEnd;
  commands: CommandRegistry;
  shell: { add: jest.Mock; activateById: jest.Mock };
  manager: PauseManager;
  sessions: { refreshRunning: jest.Mock };
  tracker: {
    currentWidget: NotebookPanel | null;
    currentChanged: Signal<object, void>;
  };
  timelines: WidgetTracker<MainAreaWidget<TimelinePanel>>;
  calls: ICall[];
}

const cleanups: (() => void)[] = [];

function harness(
  settings: ServerConnection.ISettings,
  calls: ICall[],
  panel: FakePanel | null = fakePanel()
): IHarness {
  const commands = new CommandRegistry();
  const shell = { add: jest.fn(), activateById: jest.fn() };
  const app = { commands, shell } as unknown as JupyterFrontEnd;
  const sessions = { refreshRunning: jest.fn().mockResolvedValue(undefined) };
  const manager = new PauseManager(
    settings,
    sessions as unknown as Session.IManager,
    nullTranslator.load('jupyter_pause')
  );
  manager.settings = { ...DEFAULT_SETTINGS, confirmBeforePause: false };
  const tracker = {
    currentWidget: panel ? asPanel(panel) : null,
    currentChanged: new Signal<object, void>({})
  };
  const timelines = new WidgetTracker<MainAreaWidget<TimelinePanel>>({
    namespace: 'jupyter-pause-timeline-test'
  });
  addCommands(
    app,
    manager,
    tracker as unknown as INotebookTracker,
    timelines,
    nullTranslator.load('jupyter_pause')
  );
  cleanups.push(() => {
    timelines.forEach(widget => widget.dispose());
    timelines.dispose();
    manager.dispose();
  });
  return {
    app,
    commands,
    shell,
    manager,
    sessions,
    tracker,
    timelines,
    calls
  };
}

/** The model of the current panel, loaded from the server. */
async function loaded(h: IHarness): Promise<NotebookPauseModel> {
  const model = h.manager.modelFor(h.tracker.currentWidget!);
  await model.refresh();
  return model;
}

/** The requests other than the poll's status and session GETs. */
const actions = (calls: ICall[]) =>
  calls.filter(call => call.method !== 'GET').map(c => `${c.method} ${c.url}`);

const messages = () =>
  Notification.manager.notifications.map(n => `${n.type}: ${n.message}`);

afterEach(() => {
  cleanups.splice(0).forEach(cleanup => cleanup());
  Notification.manager.dismiss();
  jest.useRealTimers();
  jest.restoreAllMocks();
});

describe('addCommands', () => {
  it('registers every command', () => {
    const { settings, calls } = fakeServer();
    const h = harness(settings, calls, null);
    for (const id of Object.values(CommandIDs)) {
      expect(h.commands.hasCommand(id)).toBe(true);
    }
  });

  it('disables the commands when no notebook is current', () => {
    const { settings, calls } = fakeServer();
    const h = harness(settings, calls, null);
    for (const id of Object.values(CommandIDs)) {
      expect(h.commands.isEnabled(id)).toBe(false);
    }
    expect(h.commands.caption(CommandIDs.pause)).toBe(
      'Save the kernel state, stop the kernel and free its GPU (open a notebook first)'
    );
    expect(h.commands.caption(CommandIDs.toggle)).toBe(
      'Pause this notebook: save its state and free its GPU (open a notebook first)'
    );
    expect(h.commands.label(CommandIDs.toggle)).toBe('Pause');
  });

  it('executes nothing when no notebook is current', async () => {
    const { settings, calls } = fakeServer();
    const h = harness(settings, calls, null);
    for (const id of Object.values(CommandIDs)) {
      await h.commands.execute(id);
    }
    expect(calls).toEqual([]);
    expect(h.shell.add).not.toHaveBeenCalled();
  });

  it('is disabled while the state is not known yet', () => {
    const { settings, calls } = fakeServer();
    const h = harness(settings, calls);
    expect(h.commands.isEnabled(CommandIDs.pause)).toBe(false);
    expect(h.commands.isEnabled(CommandIDs.timeline)).toBe(true);
    expect(h.commands.caption(CommandIDs.pause)).toBe(
      'Save the kernel state, stop the kernel and free its GPU'
    );
  });

  it('enables pause and checkpoint of an active notebook, not resume', async () => {
    const { settings, calls } = fakeServer();
    const h = harness(settings, calls);
    await loaded(h);
    expect(h.commands.isEnabled(CommandIDs.pause)).toBe(true);
    expect(h.commands.isEnabled(CommandIDs.checkpoint)).toBe(true);
    expect(h.commands.isEnabled(CommandIDs.toggle)).toBe(true);
    expect(h.commands.isEnabled(CommandIDs.timeline)).toBe(true);
    expect(h.commands.isEnabled(CommandIDs.resume)).toBe(false);
    expect(h.commands.isEnabled(CommandIDs.accept)).toBe(false);
    expect(h.commands.label(CommandIDs.toggle)).toBe('Pause');
    expect(h.commands.icon(CommandIDs.toggle)).toBe(pauseIcon);
    expect(h.commands.caption(CommandIDs.toggle)).toBe(
      'Pause this notebook: save its state and free its GPU'
    );
    expect(h.commands.className(CommandIDs.toggle)).toBe(
      'jp-JupyterPause-Toggle'
    );
  });

  it('pauses: POSTs the pause URL and takes the answered session', async () => {
    const state = {
      session: session(),
      post: (call: ICall) =>
        call.url.includes('/pause/')
          ? json(202, session({ state: 'paused', kernel_id: null, gpus: [] }))
          : new Response('', { status: 500 })
    };
    const { settings, calls } = fakeServer(state);
    const h = harness(settings, calls);
    const model = await loaded(h);
    let changed = 0;
    h.commands.commandChanged.connect(() => changed++);

    await h.commands.execute(CommandIDs.pause);

    expect(actions(calls)).toEqual([
      `POST ${BASE}jupyter-pause/pause/${ENCODED}`
    ]);
    expect(model.session?.state).toBe('paused');
    expect(model.view.state).toBe('paused');
    expect(changed).toBeGreaterThan(0);
    expect(h.commands.isEnabled(CommandIDs.resume)).toBe(true);
    expect(h.commands.isEnabled(CommandIDs.pause)).toBe(false);
    expect(h.commands.isEnabled(CommandIDs.checkpoint)).toBe(false);
    expect(h.commands.label(CommandIDs.toggle)).toBe('Resume');
    expect(h.commands.icon(CommandIDs.toggle)).toBe(resumeIcon);
    expect(h.commands.caption(CommandIDs.toggle)).toBe(
      'Resume this notebook: restore its saved state'
    );
    expect(messages()).toEqual([]);
  });

  it('pauses into an in-flight state: the view is busy', async () => {
    const state = {
      session: session(),
      post: () => json(202, session({ state: 'pausing' }))
    };
    const { settings, calls } = fakeServer(state);
    const h = harness(settings, calls);
    const model = await loaded(h);
    await h.commands.execute(CommandIDs.toggle);
    expect(actions(calls)).toEqual([
      `POST ${BASE}jupyter-pause/pause/${ENCODED}`
    ]);
    expect(model.view.state).toBe('pausing');
    expect(model.view.busy).toBe(true);
    expect(model.view.label).toBe('Pausing');
    // neither pause nor resume while it is in flight
    expect(h.commands.isEnabled(CommandIDs.toggle)).toBe(false);
  });

  it('asks before pausing when the settings say so', async () => {
    const state = {
      session: session(),
      post: () => json(202, session({ state: 'pausing' }))
    };
    const { settings, calls } = fakeServer(state);
    const h = harness(settings, calls);
    h.manager.settings = { ...DEFAULT_SETTINGS, confirmBeforePause: true };
    await loaded(h);

    const cancelled = h.commands.execute(CommandIDs.pause);
    await dismissDialog();
    await cancelled;
    expect(actions(calls)).toEqual([]);

    const accepted = h.commands.execute(CommandIDs.pause);
    await acceptDialog();
    await accepted;
    expect(actions(calls)).toEqual([
      `POST ${BASE}jupyter-pause/pause/${ENCODED}`
    ]);
  });

  it('says why a pause failed and refreshes the state', async () => {
    const state = {
      session: session(),
      post: () => json(409, { message: 'A resume of this notebook is running' })
    };
    const { settings, calls } = fakeServer(state);
    const h = harness(settings, calls);
    const model = await loaded(h);
    calls.splice(0);

    await h.commands.execute(CommandIDs.pause);

    expect(calls.map(c => `${c.method} ${c.url}`)).toEqual([
      `POST ${BASE}jupyter-pause/pause/${ENCODED}`,
      `GET ${BASE}jupyter-pause/sessions/${ENCODED}`
    ]);
    expect(messages()).toEqual([
      'error: Cannot pause: A resume of this notebook is running'
    ]);
    expect(Notification.manager.notifications[0].options.autoClose).toBe(8000);
    expect(model.session?.state).toBe('active');
  });

  it('resumes a paused notebook: POSTs the resume URL', async () => {
    const state = {
      session: session({ state: 'paused', kernel_id: null }),
      post: (call: ICall) =>
        call.url.includes('/resume/')
          ? json(202, session({ state: 'resuming', kernel_id: null }))
          : new Response('', { status: 500 })
    };
    const { settings, calls } = fakeServer(state);
    const h = harness(settings, calls);
    const model = await loaded(h);
    expect(h.commands.isEnabled(CommandIDs.resume)).toBe(true);
    expect(h.commands.isEnabled(CommandIDs.pause)).toBe(false);

    await h.commands.execute(CommandIDs.toggle);

    expect(actions(calls)).toEqual([
      `POST ${BASE}jupyter-pause/resume/${ENCODED}`
    ]);
    expect(model.session?.state).toBe('resuming');
    expect(model.view.label).toBe('Resuming');
  });

  it('says why a resume failed and refreshes the state', async () => {
    const state = {
      session: session({ state: 'paused', kernel_id: null }),
      post: () => json(503, { message: 'No GPU in this pool' })
    };
    const { settings, calls } = fakeServer(state);
    const h = harness(settings, calls);
    await loaded(h);
    calls.splice(0);

    await h.commands.execute(CommandIDs.resume);

    expect(calls.map(c => `${c.method} ${c.url}`)).toEqual([
      `POST ${BASE}jupyter-pause/resume/${ENCODED}`,
      `GET ${BASE}jupyter-pause/sessions/${ENCODED}`
    ]);
    expect(messages()).toEqual(['error: Cannot resume: No GPU in this pool']);
  });

  it('checkpoints: POSTs the checkpoint URL and says what was saved', async () => {
    const answer: ICheckpointResponse = {
      result: {
        checkpoint_id: '3',
        saved: ['x', 'y'],
        skipped: {},
        bytes_written: 1536,
        bytes_reused: 0,
        bytes_total: 1536,
        seconds: 0.42
      },
      session: session({
        checkpoint: { id: '3', created: 1, bytes: 1536 }
      })
    };
    const state = {
      session: session(),
      post: (call: ICall) =>
        call.url.includes('/checkpoint/')
          ? json(200, answer)
          : new Response('', { status: 500 })
    };
    const { settings, calls } = fakeServer(state);
    const h = harness(settings, calls);
    const model = await loaded(h);

    await h.commands.execute(CommandIDs.checkpoint);

    expect(actions(calls)).toEqual([
      `POST ${BASE}jupyter-pause/checkpoint/${ENCODED}`
    ]);
    expect(messages()).toEqual([
      'success: Checkpoint 3: 2 variables, 1.5 KB written in 0.4 s'
    ]);
    expect(model.session?.checkpoint?.id).toBe('3');
  });

  it('checkpoints: names one variable, and counts the skipped ones', async () => {
    const answer: ICheckpointResponse = {
      result: {
        checkpoint_id: '4',
        saved: ['x'],
        skipped: { conn: 'cannot pickle socket' },
        bytes_written: 12,
        bytes_reused: 0,
        bytes_total: 12,
        seconds: 75
      },
      session: session()
    };
    const { settings, calls } = fakeServer({
      session: session(),
      post: () => json(200, answer)
    });
    const h = harness(settings, calls);
    await loaded(h);
    await h.commands.execute(CommandIDs.checkpoint);
    expect(messages()).toEqual([
      'success: Checkpoint 4: 1 variable, 12 B written in 1 min 15 s; 1 skipped'
    ]);
  });

  it('says why a checkpoint failed', async () => {
    const { settings, calls } = fakeServer({
      session: session(),
      post: () => json(409, { message: 'The kernel is busy' })
    });
    const h = harness(settings, calls);
    const model = await loaded(h);
    await h.commands.execute(CommandIDs.checkpoint);
    expect(messages()).toEqual([
      'error: Checkpoint failed: The kernel is busy'
    ]);
    expect(model.session?.state).toBe('active');
  });

  it('accepts an incomplete restore only while a hold is set', async () => {
    const hold = {
      checkpoints: {
        '7': { failed: { model: 'CUDA out of memory' }, since: 1 }
      }
    };
    const state = {
      session: session({ state: 'partial', kernel_id: 'k1', hold }),
      post: (call: ICall) =>
        call.url.includes('/accept/')
          ? json(200, session({ state: 'ready', kernel_id: 'k1' }))
          : new Response('', { status: 500 })
    };
    const { settings, calls } = fakeServer(state);
    const h = harness(settings, calls);
    const model = await loaded(h);
    expect(h.commands.isEnabled(CommandIDs.accept)).toBe(true);

    await h.commands.execute(CommandIDs.accept);

    expect(actions(calls)).toEqual([
      `POST ${BASE}jupyter-pause/accept/${ENCODED}`
    ]);
    expect(model.session?.hold).toBeNull();
    expect(h.commands.isEnabled(CommandIDs.accept)).toBe(false);
  });

  it('says why an accept failed and refreshes the state', async () => {
    const hold = { checkpoints: {} };
    const { settings, calls } = fakeServer({
      session: session({ state: 'partial', hold }),
      post: () => json(500, { message: 'hold file is read-only' })
    });
    const h = harness(settings, calls);
    await loaded(h);
    calls.splice(0);
    await h.commands.execute(CommandIDs.accept);
    expect(calls.map(c => `${c.method} ${c.url}`)).toEqual([
      `POST ${BASE}jupyter-pause/accept/${ENCODED}`,
      `GET ${BASE}jupyter-pause/sessions/${ENCODED}`
    ]);
    expect(messages()).toEqual([
      'error: Cannot accept: hold file is read-only'
    ]);
  });

  it('is unavailable when the server extension is missing', async () => {
    const warn = jest
      .spyOn(console, 'warn')
      .mockImplementation(() => undefined);
    const { settings, calls } = fakeServer({ session: null, status: 404 });
    const h = harness(settings, calls);
    const model = await loaded(h);
    expect(h.manager.server).toBe('missing');
    expect(model.view.state).toBe('unavailable');
    for (const id of Object.values(CommandIDs)) {
      expect(h.commands.isEnabled(id)).toBe(false);
    }
    const caption = h.commands.caption(CommandIDs.pause);
    expect(caption).toMatch(
      /^Save the kernel state, stop the kernel and free its GPU: unavailable\. /
    );
    expect(caption).toContain('jupyter server extension enable jupyter_pause');
    expect(h.commands.caption(CommandIDs.timeline)).toContain('unavailable');
    // the session is never asked for
    expect(calls.map(c => c.url)).not.toContain(
      `${BASE}jupyter-pause/sessions/${ENCODED}`
    );
    expect(warn).toHaveBeenCalledTimes(1);
  });

  it('follows the current notebook', async () => {
    const { settings, calls } = fakeServer();
    const h = harness(settings, calls, null);
    let changed = 0;
    h.commands.commandChanged.connect(() => changed++);
    const panel = fakePanel();
    h.tracker.currentWidget = asPanel(panel);
    h.tracker.currentChanged.emit(undefined);
    expect(changed).toBe(1);
    await loaded(h);
    expect(h.commands.isEnabled(CommandIDs.pause)).toBe(true);
  });

  it('opens one timeline panel per path', async () => {
    const { settings, calls } = fakeServer();
    const h = harness(settings, calls);
    await loaded(h);

    await h.commands.execute(CommandIDs.timeline);

    expect(h.shell.add).toHaveBeenCalledTimes(1);
    const [widget, area, options] = h.shell.add.mock.calls[0];
    expect(area).toBe('main');
    expect(options).toEqual({ mode: 'split-right' });
    expect(widget.id).toBe(
      `jupyter-pause-timeline-${encodeURIComponent(PATH)}`
    );
    expect(widget.title.label).toBe('Pause timeline: my model.ipynb');
    expect(widget.content.path).toBe(PATH);
    expect(h.timelines.size).toBe(1);
    expect(h.shell.activateById).toHaveBeenLastCalledWith(widget.id);
    expect(calls.map(c => c.url)).toContain(
      `${BASE}jupyter-pause/timeline/${ENCODED}`
    );
    expect(widget.content.node.querySelector('h2')?.textContent).toBe(PATH);

    await h.commands.execute(CommandIDs.timeline);
    expect(h.shell.add).toHaveBeenCalledTimes(1);
    expect(h.shell.activateById).toHaveBeenCalledTimes(2);
    expect(h.shell.activateById).toHaveBeenLastCalledWith(widget.id);

    // another path: another panel
    await h.commands.execute(CommandIDs.timeline, { path: 'other.ipynb' });
    expect(h.shell.add).toHaveBeenCalledTimes(2);
    expect(h.shell.add.mock.calls[1][0].id).toBe(
      'jupyter-pause-timeline-other.ipynb'
    );
    expect(h.timelines.size).toBe(2);
  });
});

describe('NotebookPauseModel', () => {
  /** Node's own setImmediate: fake timers leave it alone, jsdom hides it. */
  const { setImmediate: realImmediate } = jest.requireActual('timers');

  /**
   * Let the clock run `ms`, then let the fetches started settle: they take
   * a few turns of the real event loop. A timer set for "now" while the fake
   * clock ticks is due 1 ms later, hence the 1 ms steps in between and the
   * margins of the assertions below.
   */
  async function advance(ms: number): Promise<void> {
    await jest.advanceTimersByTimeAsync(ms);
    for (let i = 0; i < 10; i++) {
      await new Promise(resolve => realImmediate(resolve));
      await jest.advanceTimersByTimeAsync(1);
    }
  }

  function fakeTimers(): void {
    jest.useFakeTimers({
      doNotFake: ['nextTick', 'queueMicrotask', 'setImmediate']
    });
  }

  const sessionGets = (calls: ICall[]) =>
    calls.filter(
      c =>
        c.method === 'GET' &&
        c.url === `${BASE}jupyter-pause/sessions/${ENCODED}`
    ).length;

  it('loads the server status and the session on its own', async () => {
    fakeTimers();
    const { settings, calls } = fakeServer();
    const h = harness(settings, calls);
    const model = h.manager.modelFor(h.tracker.currentWidget!);
    expect(h.manager.modelFor(h.tracker.currentWidget!)).toBe(model);
    expect(model.view.state).toBe('unknown');
    expect(model.view.label).toBe('Checking...');
    await advance(0);
    expect(calls.map(c => `${c.method} ${c.url}`)).toEqual([
      `GET ${BASE}jupyter-pause/status`,
      `GET ${BASE}jupyter-pause/sessions/${ENCODED}`
    ]);
    expect(h.manager.server).toBe('ok');
    expect(model.path).toBe(PATH);
    expect(model.view.state).toBe('active');
  });

  it('polls fast after an in-flight session is set, then at the regular interval', async () => {
    fakeTimers();
    const state = { session: session() };
    const { settings, calls } = fakeServer(state);
    const h = harness(settings, calls);
    const model = h.manager.modelFor(h.tracker.currentWidget!);
    await advance(0);
    expect(sessionGets(calls)).toBe(1);

    state.session = session({ state: 'paused', kernel_id: null });
    model.setSession(session({ state: 'pausing' }));
    expect(model.view.state).toBe('pausing');
    // 1 s, not the regular 5 s
    await advance(900);
    expect(sessionGets(calls)).toBe(1);
    expect(model.view.state).toBe('pausing');
    await advance(200);
    expect(sessionGets(calls)).toBe(2);
    expect(model.view.state).toBe('paused');

    // settled: back to the regular interval (5 s by default)
    await advance(4700);
    expect(sessionGets(calls)).toBe(2);
    await advance(400);
    expect(sessionGets(calls)).toBe(3);
  });

  it('polls at the interval of the settings', async () => {
    fakeTimers();
    const { settings, calls } = fakeServer();
    const h = harness(settings, calls);
    h.manager.modelFor(h.tracker.currentWidget!);
    await advance(0);
    h.manager.settings = { ...DEFAULT_SETTINGS, refreshIntervalSeconds: 30 };
    // the tick already scheduled keeps its 5 s
    await advance(5100);
    expect(sessionGets(calls)).toBe(2);
    await advance(29_700);
    expect(sessionGets(calls)).toBe(2);
    await advance(400);
    expect(sessionGets(calls)).toBe(3);
  });

  it('reconnects the panel to the kernel of a resumed session, once', async () => {
    fakeTimers();
    const state = { session: session({ state: 'paused', kernel_id: null }) };
    const { settings, calls } = fakeServer(state);
    const h = harness(settings, calls);
    const panel = h.tracker.currentWidget as unknown as FakePanel;
    const model = h.manager.modelFor(h.tracker.currentWidget!);
    await advance(0);
    expect(model.view.state).toBe('paused');
    // (the panel was told at once that its stopped kernel's session ended)
    expect(h.sessions.refreshRunning).toHaveBeenCalledTimes(1);

    model.setSession(session({ state: 'resuming', kernel_id: null }));
    state.session = session({ state: 'ready', kernel_id: 'k2', how: 'live' });
    expect(panel.sessionContext.changeKernel).not.toHaveBeenCalled();
    await advance(1100);
    expect(sessionGets(calls)).toBe(2);
    expect(model.view.label).toBe('Ready: live session restored');
    expect(h.sessions.refreshRunning).toHaveBeenCalledTimes(2);
    expect(panel.sessionContext.changeKernel).toHaveBeenCalledTimes(1);
    expect(panel.sessionContext.changeKernel).toHaveBeenCalledWith({
      id: 'k2'
    });
    // the fake panel still reports the old kernel, yet no second reconnect
    await advance(5100);
    expect(sessionGets(calls)).toBe(3);
    expect(panel.sessionContext.changeKernel).toHaveBeenCalledTimes(1);
  });

  /**
   * A notebook restored from files into a kernel whose status JupyterLab does
   * not know (the resume moved the kernel: its websocket reconnects).
   */
  function resumedKernel() {
    fakeTimers();
    const state = {
      session: session({ state: 'ready', kernel_id: 'k1', how: 'files' })
    };
    const { settings, calls } = fakeServer(state);
    const h = harness(settings, calls);
    const panel = h.tracker.currentWidget as unknown as FakePanel;
    const kernel = panel.sessionContext.session.kernel;
    kernel.status = 'unknown';
    return { h, calls, panel, kernel };
  }

  it('asks the status of the resumed kernel it reconnected to, once', async () => {
    const { h, calls, panel, kernel } = resumedKernel();
    kernel.connectionStatus = 'connecting';
    const model = h.manager.modelFor(h.tracker.currentWidget!);
    await advance(0);
    expect(model.view.state).toBe('ready');
    expect(kernel.requestIsComplete).not.toHaveBeenCalled();

    // When the websocket is connected again
    kernel.connectionStatus = 'connected';
    panel.sessionContext.connectionStatusChanged.emit('connected');

    // Then a request whose status JupyterLab counts goes to the kernel, runs nothing
    expect(kernel.requestIsComplete).toHaveBeenCalledTimes(1);
    expect(kernel.requestIsComplete).toHaveBeenCalledWith({ code: '' });
    // and once the kernel said idle, the polls ask no more
    kernel.status = 'idle';
    await advance(11000);
    expect(sessionGets(calls)).toBeGreaterThan(1);
    expect(kernel.requestIsComplete).toHaveBeenCalledTimes(1);
  });

  it('asks again once reconnected when its request went on a closing websocket', async () => {
    const { h, panel, kernel } = resumedKernel();
    // The first request goes on a websocket the server is closing: the browser
    // drops it, and JupyterLab never settles it.
    kernel.requestIsComplete.mockReturnValueOnce(new Promise(() => undefined));
    h.manager.modelFor(h.tracker.currentWidget!);
    await advance(0);
    expect(kernel.requestIsComplete).toHaveBeenCalledTimes(1);
    await advance(11000);
    expect(kernel.requestIsComplete).toHaveBeenCalledTimes(1);

    // When the websocket closes and connects again, its status still unknown
    kernel.connectionStatus = 'connecting';
    panel.sessionContext.connectionStatusChanged.emit('connecting');
    kernel.connectionStatus = 'connected';
    panel.sessionContext.connectionStatusChanged.emit('connected');

    // Then the kernel is asked again, on the new connection
    expect(kernel.requestIsComplete).toHaveBeenCalledTimes(2);
  });

  it('lets go of the kernel a pause stopped, once, so Restart Kernel starts a new one', async () => {
    fakeTimers();
    const state = { session: session({ state: 'active', kernel_id: 'k1' }) };
    const { settings, calls } = fakeServer(state);
    const h = harness(settings, calls);
    const model = h.manager.modelFor(h.tracker.currentWidget!);
    await advance(0);
    expect(h.sessions.refreshRunning).not.toHaveBeenCalled();

    state.session = session({ state: 'paused', kernel_id: null });
    await advance(5100);
    await advance(5100);
    expect(sessionGets(calls)).toBe(3);
    expect(model.view.state).toBe('paused');
    expect(h.sessions.refreshRunning).toHaveBeenCalledTimes(1);
    // A paused notebook opened again has a kernel of its own: nothing to let go of.
    state.session = session({
      state: 'paused',
      kernel_id: 'k3',
      unrestored_kernel: true
    });
    await advance(5100);
    expect(sessionGets(calls)).toBe(4);
    expect(h.sessions.refreshRunning).toHaveBeenCalledTimes(1);
  });

  it('does not reconnect when the panel already uses the kernel', async () => {
    const { settings, calls } = fakeServer({
      session: session({ state: 'ready', kernel_id: 'k1' })
    });
    const h = harness(settings, calls);
    const panel = h.tracker.currentWidget as unknown as FakePanel;
    await loaded(h);
    expect(h.sessions.refreshRunning).not.toHaveBeenCalled();
    expect(panel.sessionContext.changeKernel).not.toHaveBeenCalled();
  });

  it('reconnects after a partial restore too, and survives a failure', async () => {
    const warn = jest
      .spyOn(console, 'warn')
      .mockImplementation(() => undefined);
    const { settings, calls } = fakeServer({ session: null });
    const h = harness(settings, calls);
    const panel = h.tracker.currentWidget as unknown as FakePanel;
    panel.sessionContext.changeKernel.mockRejectedValue(new Error('gone'));
    const model = await loaded(h);
    expect(model.view.state).toBe('none');

    model.setSession(session({ state: 'partial', kernel_id: 'k3' }));
    await new Promise(resolve => setTimeout(resolve, 0));
    expect(panel.sessionContext.changeKernel).toHaveBeenCalledWith({
      id: 'k3'
    });
    expect(warn).toHaveBeenCalledWith(
      `jupyter-pause: could not reconnect ${PATH} to its resumed kernel: gone`
    );
  });

  it('resumes a paused notebook on open when the settings say so', async () => {
    const state = {
      session: session({ state: 'paused', kernel_id: null }),
      post: () => json(202, session({ state: 'resuming', kernel_id: null }))
    };
    const { settings, calls } = fakeServer(state);
    const h = harness(settings, calls);
    h.manager.settings = { ...DEFAULT_SETTINGS, autoResumeOnOpen: true };
    const model = await loaded(h);
    expect(actions(calls)).toEqual([
      `POST ${BASE}jupyter-pause/resume/${ENCODED}`
    ]);
    expect(model.session?.state).toBe('resuming');
    // only on open: a later paused answer is left alone
    await model.refresh();
    expect(actions(calls)).toHaveLength(1);
  });

  it('keeps the paused state when the automatic resume fails', async () => {
    const warn = jest
      .spyOn(console, 'warn')
      .mockImplementation(() => undefined);
    const { settings, calls } = fakeServer({
      session: session({ state: 'paused', kernel_id: null }),
      post: () => json(503, { message: 'no GPU' })
    });
    const h = harness(settings, calls);
    h.manager.settings = { ...DEFAULT_SETTINGS, autoResumeOnOpen: true };
    const model = await loaded(h);
    expect(model.session?.state).toBe('paused');
    expect(warn).toHaveBeenCalledWith(
      'jupyter-pause: automatic resume failed: no GPU'
    );
  });

  it('marks the server unreachable when a session request gets no answer', async () => {
    let up = true;
    const { settings, calls } = server(call => {
      if (!up) {
        return Promise.reject(new TypeError('connection refused'));
      }
      return call.url.endsWith('/status')
        ? json(200, STATUS)
        : json(200, session());
    });
    const h = harness(settings, calls);
    const model = await loaded(h);
    expect(h.manager.server).toBe('ok');
    up = false;
    await model.refresh();
    expect(h.manager.server).toBe('unreachable');
    expect(model.view.label).toBe('Server unreachable');
    expect(h.commands.isEnabled(CommandIDs.pause)).toBe(false);
    expect(h.commands.caption(CommandIDs.checkpoint)).toMatch(
      /: unavailable\. The Jupyter server does not answer/
    );
    // still down: the next fetch asks for the status, in vain
    calls.splice(0);
    await model.refresh();
    expect(calls.map(c => c.url)).toEqual([`${BASE}jupyter-pause/status`]);
    expect(h.manager.server).toBe('unreachable');
    expect(h.manager.status?.backend).toBe('local');
    // back: the next fetch asks for the status first
    up = true;
    calls.splice(0);
    await model.refresh();
    expect(calls.map(c => c.url)).toEqual([
      `${BASE}jupyter-pause/status`,
      `${BASE}jupyter-pause/sessions/${ENCODED}`
    ]);
    expect(model.view.state).toBe('active');
  });

  it('reports edits as activity, at most once a minute', async () => {
    const { settings, calls } = fakeServer({
      session: session(),
      post: () => new Response('', { status: 404 })
    });
    const h = harness(settings, calls);
    const panel = h.tracker.currentWidget as unknown as FakePanel;
    await loaded(h);
    const now = jest.spyOn(Date, 'now').mockReturnValue(1_000_000_000);
    panel.context.model.contentChanged.emit(undefined);
    panel.context.model.contentChanged.emit(undefined);
    now.mockReturnValue(1_000_000_000 + 59_999);
    panel.context.model.contentChanged.emit(undefined);
    await new Promise(resolve => setTimeout(resolve, 0));
    expect(actions(calls)).toEqual([
      `POST ${BASE}jupyter-pause/activity/${ENCODED}`
    ]);
    now.mockReturnValue(1_000_000_000 + 60_000);
    panel.context.model.contentChanged.emit(undefined);
    await new Promise(resolve => setTimeout(resolve, 0));
    expect(actions(calls)).toHaveLength(2);

    // not when the settings say no
    h.manager.settings = {
      ...DEFAULT_SETTINGS,
      reportEditsAsActivity: false
    };
    now.mockReturnValue(1_000_000_000 + 200_000);
    panel.context.model.contentChanged.emit(undefined);
    await new Promise(resolve => setTimeout(resolve, 0));
    expect(actions(calls)).toHaveLength(2);
  });

  it('is disposed with its panel, and a new one made after', async () => {
    const { settings, calls } = fakeServer();
    const h = harness(settings, calls);
    const panel = h.tracker.currentWidget as unknown as FakePanel;
    const model = await loaded(h);
    panel.disposed.emit(undefined);
    expect(model.isDisposed).toBe(true);
    model.dispose();
    expect(h.manager.modelFor(asPanel(panel))).not.toBe(model);
  });

  it('disposes its models with the manager', async () => {
    const { settings, calls } = fakeServer();
    const h = harness(settings, calls);
    const model = await loaded(h);
    h.manager.dispose();
    expect(model.isDisposed).toBe(true);
    expect(h.manager.isDisposed).toBe(true);
    // a disposed model ignores sessions set late
    model.setSession(session({ state: 'pausing' }));
    model.applyInterval();
    expect(model.session?.state).toBe('pausing');
  });
});
