import { JupyterFrontEnd } from '@jupyterlab/application';
import {
  MainAreaWidget,
  Notification,
  WidgetTracker
} from '@jupyterlab/apputils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { ServerConnection, Session } from '@jupyterlab/services';
import {
  acceptDialog,
  dangerDialog,
  dismissDialog
} from '@jupyterlab/testing/lib/common';
import { nullTranslator } from '@jupyterlab/translation';
import { CommandRegistry } from '@lumino/commands';
import { Signal } from '@lumino/signaling';

import { ISession, PauseClient } from '../api';
import { CommandIDs, addCommands } from '../commands';
import { DEFAULT_SETTINGS, PauseManager } from '../model';
import {
  IImportOrigin,
  cleanNotebookPath,
  defaultImportPath,
  importOrigin,
  importState,
  needsTrust,
  resumeTrusting
} from '../sessionfile';
import {
  IMPORT_INPUT_CLASS,
  SessionFileCommandIDs,
  TransferNotice,
  addSessionFileCommands,
  importDroppedSessions,
  transferText
} from '../sessionfilecommands';
import { TimelinePanel } from '../timeline';
import { ITransferProgress, attachmentName, download } from '../transfer';
import { sessionView } from '../view';

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
const trans = nullTranslator.load('jupyter_pause');

/** The message of an untrusted import (server/transfer.py imported_message). */
const UNTRUSTED =
  'Paused (imported from ada on gpu-box, 2025-01-02 18:02). Trust it to resume: restoring runs code from it. Differs here: numpy 2.1.0 there, 1.26.4 here; no GPU here.';
const TRUSTED =
  'Paused (imported from ada on gpu-box, 2025-01-02 18:02). Resume restores it from files.';
/** The refusal of a resume of an untrusted import (409). */
const REFUSAL =
  `Cannot resume ${PATH} yet. This session was imported from ada on gpu-box (2025-01-02 18:02). ` +
  "Restoring it runs code from it: trust it first (`jupyter pause trust NOTEBOOK`, or Trust in the notebook's menu).";

const ORIGIN: IImportOrigin = {
  madeBy: 'ada',
  madeOn: 'gpu-box',
  madeAt: '2025-01-02 18:02',
  differences: []
};

const session = (fields: Partial<ISession> = {}): ISession =>
  sessionAt({ path: PATH, ...fields });

const paused = (message = '', fields: Partial<ISession> = {}) =>
  session({ state: 'paused', kernel_id: null, gpus: [], message, ...fields });

/** The requests other than GETs. */
const actions = (calls: ICall[]) =>
  calls.filter(call => call.method !== 'GET').map(c => `${c.method} ${c.url}`);

const messages = () =>
  Notification.manager.notifications.map(n => `${n.type}: ${n.message}`);

/** The bytes of a Blob (jsdom's Blob has no `arrayBuffer`). */
function bytesOf(blob: Blob): Promise<Uint8Array> {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(new Uint8Array(reader.result as ArrayBuffer));
    reader.onerror = () => reject(reader.error);
    reader.readAsArrayBuffer(blob);
  });
}

/**
 * The ReadableStream of the Response the tests use (Node's: jsdom has none).
 */
const NodeReadableStream = new Response('x').body!
  .constructor as typeof ReadableStream;

/** A streamed body of `chunks`, with the export's headers. */
function tarResponse(
  chunks: number[][],
  headers: Record<string, string> = {}
): Response {
  const stream = new NodeReadableStream<Uint8Array>({
    start(controller: ReadableStreamDefaultController<Uint8Array>) {
      for (const chunk of chunks) {
        controller.enqueue(new Uint8Array(chunk));
      }
      controller.close();
    }
  });
  const length = chunks.reduce((n, chunk) => n + chunk.length, 0);
  return new Response(stream, {
    status: 200,
    headers: {
      'Content-Type': 'application/x-tar',
      'Content-Length': String(length),
      ...headers
    }
  });
}

/** One request the fake XMLHttpRequest sent. */
interface ISent {
  method: string;
  url: string;
  headers: Record<string, string>;
  body: Blob;
}

/**
 * A stand-in for XMLHttpRequest: reports the upload in two halves, then
 * answers what `FakeXhr.answer` says (`null`: a network error).
 */
class FakeXhr {
  static answer: (sent: ISent) => { status: number; body: unknown } | null =
    () => null;
  static sent: ISent[] = [];

  upload: { onprogress: ((event: ProgressEvent) => void) | null } = {
    onprogress: null
  };
  onload: (() => void) | null = null;
  onerror: (() => void) | null = null;
  onabort: (() => void) | null = null;
  status = 0;
  statusText = '';
  responseText = '';
  withCredentials = false;

  open(method: string, url: string): void {
    this._sent.method = method;
    this._sent.url = url.split('?')[0];
  }

  setRequestHeader(name: string, value: string): void {
    this._sent.headers[name.toLowerCase()] = value;
  }

  getAllResponseHeaders(): string {
    return 'content-type: application/json\r\nx-test: yes\r\n';
  }

  send(body: Blob): void {
    this._sent.body = body;
    FakeXhr.sent.push(this._sent);
    setTimeout(() => {
      const total = body.size;
      for (const loaded of [Math.floor(total / 2), total]) {
        this.upload.onprogress?.({
          loaded,
          total,
          lengthComputable: true
        } as ProgressEvent);
      }
      const answer = FakeXhr.answer(this._sent);
      if (!answer) {
        this.onerror?.();
        return;
      }
      this.status = answer.status;
      this.responseText = JSON.stringify(answer.body);
      this.onload?.();
    }, 0);
  }

  private _sent: ISent = {
    method: '',
    url: '',
    headers: {},
    body: new Blob([])
  };
}

const realXhr = globalThis.XMLHttpRequest;

beforeEach(() => {
  FakeXhr.sent = [];
  FakeXhr.answer = () => null;
  (globalThis as any).XMLHttpRequest = FakeXhr;
});

afterEach(() => {
  (globalThis as any).XMLHttpRequest = realXhr;
  Notification.manager.dismiss();
  jest.restoreAllMocks();
});

describe('importOrigin', () => {
  it('reads who, where and when from the session message, and what differs', () => {
    expect(importOrigin(UNTRUSTED)).toEqual({
      ...ORIGIN,
      differences: ['numpy 2.1.0 there, 1.26.4 here', 'no GPU here']
    });
  });

  it('reads them from the refusal of a resume', () => {
    expect(importOrigin(REFUSAL)).toEqual(ORIGIN);
  });

  it('answers null for other words', () => {
    expect(importOrigin('Paused since 18:02.')).toBeNull();
  });
});

describe('importState', () => {
  it('tells an untrusted import, a trusted one, and a session made here', () => {
    expect(importState(paused(UNTRUSTED))).toBe('untrusted');
    expect(importState(paused(TRUSTED))).toBe('trusted');
    expect(importState(paused('Paused by the user.'))).toBeNull();
    expect(importState(null)).toBeNull();
  });
});

describe('needsTrust', () => {
  const error = (status: number, message: string) =>
    new ServerConnection.ResponseError(new Response('', { status }), message);

  it('is true for the 409 asking for trust only', () => {
    expect(needsTrust(error(409, REFUSAL))).toBe(true);
    expect(needsTrust(error(409, 'A resume is running'))).toBe(false);
    expect(needsTrust(error(400, REFUSAL))).toBe(false);
    expect(needsTrust(new Error(REFUSAL))).toBe(false);
  });
});

describe('defaultImportPath', () => {
  it("is the file's stem as a notebook in the folder", () => {
    expect(defaultImportPath('model.jpsession', 'work/a')).toBe(
      'work/a/model.ipynb'
    );
    expect(defaultImportPath('model.JPSESSION', '/work/')).toBe(
      'work/model.ipynb'
    );
    expect(defaultImportPath('model (1).jpsession')).toBe('model (1).ipynb');
    expect(defaultImportPath('C:\\fakepath\\run.tar', '')).toBe('run.ipynb');
    expect(defaultImportPath('.jpsession', '')).toBe('imported.ipynb');
  });

  it('cleans a typed path', () => {
    expect(cleanNotebookPath('  /work/x.ipynb ')).toBe('work/x.ipynb');
  });
});

describe('attachmentName', () => {
  it('reads the file name of Content-Disposition', () => {
    expect(attachmentName('attachment; filename="model.jpsession"')).toBe(
      'model.jpsession'
    );
    expect(attachmentName('attachment; filename=model.jpsession')).toBe(
      'model.jpsession'
    );
    expect(
      attachmentName(
        'attachment; filename="x.jpsession"; filename*=UTF-8\'\'my%20model.jpsession'
      )
    ).toBe('my model.jpsession');
    expect(attachmentName('attachment')).toBeNull();
    expect(attachmentName(null)).toBeNull();
  });
});

describe('transferText', () => {
  it('says the bytes done, of the total when known', () => {
    expect(transferText({ done: 1_500_000, total: 6_000_000 }, trans)).toBe(
      '1.5 MB of 6.0 MB (25%)'
    );
    expect(transferText({ done: 1_500_000, total: 0 }, trans)).toBe('1.5 MB');
  });
});

describe('TransferNotice', () => {
  beforeEach(() => {
    jest.useFakeTimers();
    Notification.manager.dismiss();
  });
  afterEach(() => {
    jest.useRealTimers();
    Notification.manager.dismiss();
  });

  const shown = () =>
    Notification.manager.notifications.map(n =>
      `${n.type}: ${n.message} ${n.options.progress ?? ''}`.trim()
    );

  it('says only the outcome of a quick transfer', () => {
    const notice = new TransferNotice('Exporting a.ipynb', trans);
    notice.progress({ done: 3, total: 3 });
    notice.end('Exported a.jpsession', 'success', 5000);
    jest.advanceTimersByTime(2000);
    expect(shown()).toEqual(['success: Exported a.jpsession']);
  });

  it('shows the bytes of a long transfer, then its outcome on its own', () => {
    const notice = new TransferNotice('Exporting a.ipynb', trans);
    notice.progress({ done: 1_000_000, total: 4_000_000 });
    expect(shown()).toEqual([]);
    jest.advanceTimersByTime(500);
    expect(shown()).toEqual([
      'in-progress: Exporting a.ipynb: 1.0 MB of 4.0 MB (25%) 0.25'
    ]);
    // Too soon after the toast was shown: kept for the next one.
    notice.progress({ done: 2_000_000, total: 4_000_000 });
    expect(shown()).toEqual([
      'in-progress: Exporting a.ipynb: 1.0 MB of 4.0 MB (25%) 0.25'
    ]);
    jest.advanceTimersByTime(250);
    notice.progress({ done: 3_000_000, total: 4_000_000 });
    expect(shown()).toEqual([
      'in-progress: Exporting a.ipynb: 3.0 MB of 4.0 MB (75%) 0.75'
    ]);
    // The outcome comes at once; the progress goes once its toast has settled.
    notice.end('Exported a.jpsession', 'success', 5000);
    expect(shown()).toEqual([
      'success: Exported a.jpsession',
      'in-progress: Exporting a.ipynb: 3.0 MB of 4.0 MB (75%) 0.75'
    ]);
    jest.advanceTimersByTime(250);
    expect(shown()).toEqual(['success: Exported a.jpsession']);
  });
});

describe('PauseClient session files', () => {
  it('exports: streams the file and reports the bytes received', async () => {
    const { settings, calls } = server(() =>
      tarResponse([[1, 2, 3], [4, 5], [6]], {
        'Content-Disposition': 'attachment; filename="my model.jpsession"',
        'X-Checkpoint-Id': '7'
      })
    );
    const progress: ITransferProgress[] = [];
    const file = await new PauseClient(settings).exportSession(PATH, p =>
      progress.push({ ...p })
    );
    expect(calls.map(c => `${c.method} ${c.url}`)).toEqual([
      `GET ${BASE}jupyter-pause/export/${ENCODED}`
    ]);
    expect(file.name).toBe('my model.jpsession');
    expect(file.checkpointId).toBe('7');
    expect(Array.from(await bytesOf(file.blob))).toEqual([1, 2, 3, 4, 5, 6]);
    expect(progress[0]).toEqual({ done: 0, total: 6 });
    expect(progress.map(p => p.done)).toEqual([0, 3, 5, 6, 6]);
  });

  it("names the file after the notebook when the server doesn't", async () => {
    const { settings } = server(() => tarResponse([[1]]));
    const file = await new PauseClient(settings).exportSession(PATH);
    expect(file.name).toBe('my model.jpsession');
    expect(file.checkpointId).toBeNull();
  });

  it("throws the server's message when the export is refused", async () => {
    const { settings } = server(() =>
      json(404, { message: 'work/my model.ipynb has no checkpoint' })
    );
    await expect(new PauseClient(settings).exportSession(PATH)).rejects.toThrow(
      'work/my model.ipynb has no checkpoint'
    );
  });

  it('says a download cut short', async () => {
    const { settings } = server(
      () =>
        new Response(new Uint8Array([1, 2]), {
          headers: { 'Content-Length': '10' }
        })
    );
    await expect(download('export/x', settings)).rejects.toBeInstanceOf(
      ServerConnection.NetworkError
    );
  });

  it('imports: uploads the file with its progress, answers session and differences', async () => {
    const { settings } = server(() => json(500, {}));
    FakeXhr.answer = () => ({
      status: 201,
      body: { session: paused(UNTRUSTED), differences: ['no GPU here'] }
    });
    const progress: ITransferProgress[] = [];
    const file = new Blob([new Uint8Array([1, 2, 3, 4])]);
    const answer = await new PauseClient(settings).importSession(
      PATH,
      file,
      p => progress.push({ ...p })
    );
    expect(answer.differences).toEqual(['no GPU here']);
    expect(answer.session.message).toBe(UNTRUSTED);
    expect(FakeXhr.sent).toHaveLength(1);
    const sent = FakeXhr.sent[0];
    expect(`${sent.method} ${sent.url}`).toBe(
      `POST ${BASE}jupyter-pause/import/${ENCODED}`
    );
    expect(sent.headers['content-type']).toBe('application/x-tar');
    expect(sent.body).toBe(file);
    expect(progress).toEqual([
      { done: 0, total: 4 },
      { done: 2, total: 4 },
      { done: 4, total: 4 }
    ]);
  });

  it("throws the server's refusal of an import", async () => {
    const { settings } = server(() => json(500, {}));
    FakeXhr.answer = () => ({
      status: 400,
      body: {
        message:
          'Session file refused, nothing was imported: data/x.pkl: checksum differs'
      }
    });
    const refused = new PauseClient(settings).importSession(
      PATH,
      new Blob(['x'])
    );
    await expect(refused).rejects.toBeInstanceOf(
      ServerConnection.ResponseError
    );
    await expect(refused).rejects.toThrow(
      'Session file refused, nothing was imported: data/x.pkl: checksum differs'
    );
  });

  it('throws a NetworkError when the upload gets no answer', async () => {
    const { settings } = server(() => json(500, {}));
    await expect(
      new PauseClient(settings).importSession(PATH, new Blob(['x']))
    ).rejects.toBeInstanceOf(ServerConnection.NetworkError);
  });

  it('trusts: POSTs the trust URL', async () => {
    const { settings, calls } = server(() => json(200, paused(TRUSTED)));
    const answer = await new PauseClient(settings).trust(PATH);
    expect(answer.message).toBe(TRUSTED);
    expect(actions(calls)).toEqual([
      `POST ${BASE}jupyter-pause/trust/${ENCODED}`
    ]);
  });
});

describe('resumeTrusting', () => {
  /** A client whose resume is refused until trust was called. */
  function client(refuse = true) {
    const log: string[] = [];
    let trusted = !refuse;
    return {
      log,
      resume: jest.fn(async (path: string, options?: { onCpu?: boolean }) => {
        log.push(`resume ${path}${options?.onCpu ? ' on cpu' : ''}`);
        if (!trusted) {
          throw new ServerConnection.ResponseError(
            new Response('', { status: 409 }),
            REFUSAL
          );
        }
        return session({ state: 'resuming' });
      }),
      trust: jest.fn(async (path: string) => {
        log.push(`trust ${path}`);
        trusted = true;
        return paused(TRUSTED);
      })
    };
  }

  it('resumes a session made here without asking', async () => {
    const c = client(false);
    const confirm = jest.fn();
    const answer = await resumeTrusting(c, PATH, { confirm });
    expect(answer?.state).toBe('resuming');
    expect(c.log).toEqual([`resume ${PATH}`]);
    expect(confirm).not.toHaveBeenCalled();
  });

  it('asks on the refusal, then trusts and resumes', async () => {
    const c = client();
    const confirm = jest.fn().mockResolvedValue(true);
    const onTrusted = jest.fn();
    const answer = await resumeTrusting(c, PATH, {
      confirm,
      onTrusted,
      onCpu: true
    });
    expect(answer?.state).toBe('resuming');
    expect(c.log).toEqual([
      `resume ${PATH} on cpu`,
      `trust ${PATH}`,
      `resume ${PATH} on cpu`
    ]);
    expect(confirm).toHaveBeenCalledWith({ origin: ORIGIN, message: REFUSAL });
    expect(onTrusted).toHaveBeenCalledWith(paused(TRUSTED));
  });

  it('asks first when the import is known untrusted', async () => {
    const c = client();
    const confirm = jest.fn(async () => {
      expect(c.log).toEqual([]);
      return true;
    });
    await resumeTrusting(c, PATH, { confirm, untrusted: ORIGIN });
    expect(confirm).toHaveBeenCalledWith({ origin: ORIGIN, message: '' });
    expect(c.log).toEqual([`trust ${PATH}`, `resume ${PATH}`]);
  });

  it('trusts and resumes nothing when the user says no', async () => {
    const c = client();
    const answer = await resumeTrusting(c, PATH, {
      confirm: async () => false
    });
    expect(answer).toBeNull();
    expect(c.log).toEqual([`resume ${PATH}`]);
  });

  it('throws other errors of the resume', async () => {
    const c = client(false);
    c.resume.mockRejectedValueOnce(new Error('no GPU'));
    const confirm = jest.fn();
    await expect(resumeTrusting(c, PATH, { confirm })).rejects.toThrow(
      'no GPU'
    );
    expect(confirm).not.toHaveBeenCalled();
  });
});

describe('sessionView of an untrusted import', () => {
  it('says where the paused session came from, and that Resume asks', () => {
    const view = sessionView(paused(UNTRUSTED), 'ok', trans, {
      untrustedImport: { ...ORIGIN, differences: ['no GPU here'] }
    });
    expect(view.label).toBe('Paused (imported from ada on gpu-box)');
    expect(view.tone).toBe('warning');
    expect(view.canResume).toBe(true);
    expect(view.tooltip).toBe(
      'This session was made by ada on gpu-box (2025-01-02 18:02) and imported from a session file. Restoring it runs code from the file: Resume asks you to trust it first.\nDiffers here: no GPU here'
    );
  });

  it('wins over the offer to restore into a new kernel', () => {
    const view = sessionView(
      paused('Paused: a new kernel runs', {
        kernel_id: 'k2',
        unrestored_kernel: true
      }),
      'ok',
      trans,
      { untrustedImport: ORIGIN }
    );
    expect(view.label).toBe('Paused (imported from ada on gpu-box)');
  });

  it('applies to a paused session only', () => {
    const view = sessionView(session({ state: 'ready' }), 'ok', trans, {
      untrustedImport: ORIGIN
    });
    expect(view.label).toBe('Ready');
  });
});

/** A light notebook panel: what the model and the commands use of it. */
function fakePanel(path = PATH) {
  return {
    id: `panel-${path}`,
    context: {
      path,
      ready: Promise.resolve(),
      model: { contentChanged: new Signal<object, void>({}), dirty: false },
      save: jest.fn().mockResolvedValue(undefined)
    },
    disposed: new Signal<object, void>({}),
    sessionContext: {
      session: {
        kernel: {
          id: 'k1',
          status: 'idle',
          connectionStatus: 'connected',
          requestIsComplete: jest.fn().mockResolvedValue({})
        }
      },
      connectionStatusChanged: new Signal<object, string>({}),
      changeKernel: jest.fn().mockResolvedValue(null)
    }
  };
}

/**
 * The commands over a fake server: GETs answer `state.session`, POSTs what
 * `state.post` says; `docmanager:open` and a file browser are stand-ins.
 */
function harness(
  state: {
    session: ISession | null;
    post?: (call: ICall) => Response;
    get?: (call: ICall) => Response | null;
  },
  panel: ReturnType<typeof fakePanel> | null = fakePanel()
) {
  const { settings, calls } = server(call => {
    if (call.url.endsWith('/jupyter-pause/status')) {
      return json(200, STATUS);
    }
    const got = call.method === 'GET' ? state.get?.(call) : null;
    if (got) {
      return got;
    }
    if (call.method === 'GET' && call.url.includes('/sessions/')) {
      return state.session
        ? json(200, state.session)
        : new Response('', { status: 404 });
    }
    if (call.method === 'POST' && state.post) {
      return state.post(call);
    }
    return new Response('', { status: 404 });
  });
  const commands = new CommandRegistry();
  const opened: string[] = [];
  commands.addCommand('docmanager:open', {
    execute: args => {
      opened.push(args.path as string);
    }
  });
  const browser = { id: 'filebrowser', model: { path: 'work' } };
  const shell = {
    add: jest.fn(),
    activateById: jest.fn(),
    widgets: jest.fn(() => [browser][Symbol.iterator]())
  };
  const app = { commands, shell } as unknown as JupyterFrontEnd;
  const manager = new PauseManager(
    settings,
    {
      refreshRunning: jest.fn().mockResolvedValue(undefined)
    } as unknown as Session.IManager,
    trans
  );
  manager.settings = { ...DEFAULT_SETTINGS, confirmBeforePause: false };
  const tracker = {
    currentWidget: panel ? (panel as unknown as NotebookPanel) : null,
    currentChanged: new Signal<object, void>({})
  };
  const timelines = new WidgetTracker<MainAreaWidget<TimelinePanel>>({
    namespace: 'jupyter-pause-timeline-sessionfile-test'
  });
  addCommands(
    app,
    manager,
    tracker as unknown as INotebookTracker,
    timelines,
    trans
  );
  addSessionFileCommands(
    app,
    manager,
    tracker as unknown as INotebookTracker,
    trans
  );
  cleanups.push(() => {
    timelines.dispose();
    manager.dispose();
  });
  const model = panel ? manager.modelFor(tracker.currentWidget!) : null;
  return { commands, manager, model, calls, opened, state };
}

const cleanups: (() => void)[] = [];
afterEach(() => {
  cleanups.splice(0).forEach(cleanup => cleanup());
});

describe('the trust question on Resume', () => {
  /** A server refusing the resume of an untrusted import until trust. */
  function importServer(message = UNTRUSTED) {
    let trusted = false;
    const state = {
      session: paused(message) as ISession | null,
      post: (call: ICall) => {
        if (call.url.includes('/trust/')) {
          trusted = true;
          return json(200, paused(TRUSTED));
        }
        if (call.url.includes('/resume/')) {
          return trusted
            ? json(202, session({ state: 'resuming', kernel_id: null }))
            : json(409, { message: REFUSAL });
        }
        return new Response('', { status: 500 });
      }
    };
    return state;
  }

  it('shows the import on the chip, remembered after a kernel is started', async () => {
    const state = importServer();
    const h = harness(state);
    await h.model!.refresh();
    expect(h.model!.view.label).toBe('Paused (imported from ada on gpu-box)');
    // Opening the notebook starts a kernel: the server's words change.
    state.session = paused(
      'Paused: a new kernel runs without the saved state.',
      {
        kernel_id: 'k1',
        unrestored_kernel: true
      }
    );
    await h.model!.refresh();
    expect(h.model!.untrustedImport?.madeBy).toBe('ada');
    expect(h.model!.view.label).toBe('Paused (imported from ada on gpu-box)');
    // Once it runs, it was trusted.
    state.session = session({ state: 'active' });
    await h.model!.refresh();
    expect(h.model!.untrustedImport).toBeNull();
  });

  it('asks before any request, then trusts and resumes', async () => {
    const h = harness(importServer());
    await h.model!.refresh();
    const resumed = h.commands.execute(CommandIDs.toggle);
    await dangerDialog();
    await resumed;
    expect(actions(h.calls)).toEqual([
      `POST ${BASE}jupyter-pause/trust/${ENCODED}`,
      `POST ${BASE}jupyter-pause/resume/${ENCODED}`
    ]);
    expect(h.model!.session?.state).toBe('resuming');
    expect(h.model!.untrustedImport).toBeNull();
  });

  it('does nothing when the question is dismissed', async () => {
    const h = harness(importServer());
    await h.model!.refresh();
    const resumed = h.commands.execute(CommandIDs.resume);
    await dismissDialog();
    await resumed;
    expect(actions(h.calls)).toEqual([]);
    expect(h.model!.view.label).toBe('Paused (imported from ada on gpu-box)');
  });

  it('Enter keeps it untrusted: Cancel is the default button', async () => {
    const h = harness(importServer());
    await h.model!.refresh();
    const resumed = h.commands.execute(CommandIDs.resume);
    await acceptDialog();
    await resumed;
    expect(actions(h.calls)).toEqual([]);
  });

  it("asks on the server's refusal when the page did not know", async () => {
    const h = harness(importServer('Paused: a new kernel runs.'));
    await h.model!.refresh();
    expect(h.model!.view.label).not.toContain('imported');
    const refused = h.commands.execute(CommandIDs.resume);
    await dismissDialog();
    await refused;
    // The chip now says where it came from.
    expect(h.model!.view.label).toBe('Paused (imported from ada on gpu-box)');
    h.calls.splice(0);
    const resumed = h.commands.execute(CommandIDs.resume);
    await dangerDialog();
    await resumed;
    expect(actions(h.calls)).toEqual([
      `POST ${BASE}jupyter-pause/trust/${ENCODED}`,
      `POST ${BASE}jupyter-pause/resume/${ENCODED}`
    ]);
    expect(messages()).toEqual([]);
  });

  it('trusts and resumes after the refusal when the user says so', async () => {
    const h = harness(importServer('Paused: a new kernel runs.'));
    await h.model!.refresh();
    const resumed = h.commands.execute(CommandIDs.toggle);
    await dangerDialog();
    await resumed;
    expect(actions(h.calls)).toEqual([
      `POST ${BASE}jupyter-pause/resume/${ENCODED}`,
      `POST ${BASE}jupyter-pause/trust/${ENCODED}`,
      `POST ${BASE}jupyter-pause/resume/${ENCODED}`
    ]);
    expect(h.model!.session?.state).toBe('resuming');
    expect(h.model!.untrustedImport).toBeNull();
  });

  it('Trust Imported Session… trusts without resuming', async () => {
    const h = harness(importServer());
    await h.model!.refresh();
    expect(h.commands.isEnabled(SessionFileCommandIDs.trustSession)).toBe(true);
    const trusting = h.commands.execute(SessionFileCommandIDs.trustSession);
    await dangerDialog();
    await trusting;
    expect(actions(h.calls)).toEqual([
      `POST ${BASE}jupyter-pause/trust/${ENCODED}`
    ]);
    expect(h.model!.untrustedImport).toBeNull();
    expect(messages()).toEqual([
      'success: Trusted: Resume restores my model.ipynb from files.'
    ]);
  });

  it('says why a trust failed', async () => {
    const h = harness({
      session: paused('Paused by the user.'),
      post: () =>
        json(404, {
          message: 'this session was not imported: there is nothing to trust'
        })
    });
    await h.model!.refresh();
    const trusting = h.commands.execute(SessionFileCommandIDs.trustSession);
    await dangerDialog();
    await trusting;
    expect(messages()).toEqual([
      'error: Cannot trust: this session was not imported: there is nothing to trust'
    ]);
  });
});

describe('Export Session…', () => {
  it('downloads the file and says what it holds', async () => {
    const created: Blob[] = [];
    (URL as any).createObjectURL = jest.fn((blob: Blob) => {
      created.push(blob);
      return 'blob:exported';
    });
    (URL as any).revokeObjectURL = jest.fn();
    const clicked: string[] = [];
    jest
      .spyOn(HTMLAnchorElement.prototype, 'click')
      .mockImplementation(function (this: HTMLAnchorElement) {
        clicked.push(`${this.download} ${this.getAttribute('href')}`);
      });
    const h = harness({
      session: session(),
      get: call =>
        call.url.includes('/export/')
          ? tarResponse([[1, 2, 3]], {
              'Content-Disposition':
                'attachment; filename="my model.jpsession"',
              'X-Checkpoint-Id': '4'
            })
          : null
    });
    await h.model!.refresh();
    expect(h.commands.isEnabled(SessionFileCommandIDs.exportSession)).toBe(
      true
    );
    await h.commands.execute(SessionFileCommandIDs.exportSession);
    expect(clicked).toEqual(['my model.jpsession blob:exported']);
    expect(created[0].size).toBe(3);
    expect(messages()).toEqual([
      'success: Exported my model.jpsession (checkpoint 4, 3 B)'
    ]);
  });

  it('says why an export failed', async () => {
    const h = harness({
      session: paused('Paused by the user.'),
      get: call =>
        call.url.includes('/export/')
          ? json(409, { message: 'no good checkpoint to export' })
          : null
    });
    await h.model!.refresh();
    await h.commands.execute(SessionFileCommandIDs.exportSession);
    expect(messages()).toEqual([
      `error: Cannot export ${PATH}: no good checkpoint to export`
    ]);
  });

  it('is disabled without a notebook, or while the state is unknown', () => {
    const h = harness({ session: session() }, null);
    expect(h.commands.isEnabled(SessionFileCommandIDs.exportSession)).toBe(
      false
    );
    expect(h.commands.isEnabled(SessionFileCommandIDs.trustSession)).toBe(
      false
    );
  });
});

describe('importDroppedSessions', () => {
  /** A file browser whose listing uploads what is dropped on it. */
  function browser() {
    const node = document.createElement('div');
    const listing = document.createElement('div');
    listing.className = 'jp-DirListing-content jp-mod-dropTarget';
    node.appendChild(listing);
    const listed: string[] = [];
    listing.addEventListener('drop', event => {
      listed.push(
        ...Array.from((event as DragEvent).dataTransfer!.files).map(f => f.name)
      );
    });
    const uploaded: string[] = [];
    const upload = jest.fn(async (file: File) => {
      uploaded.push(file.name);
    });
    return {
      target: { id: 'filebrowser', node, model: { path: 'work', upload } },
      listing,
      listed,
      uploaded
    };
  }

  /** Drop `names` on `node`, as the browser does; whether it was taken. */
  function drop(node: HTMLElement, names: string[]): boolean {
    const event = new Event('drop', { bubbles: true, cancelable: true });
    Object.defineProperty(event, 'dataTransfer', {
      value: { files: names.map(name => new File(['x'], name)) }
    });
    node.dispatchEvent(event);
    return event.defaultPrevented;
  }

  it('imports the session files, uploads the others, and the listing sees none', async () => {
    const b = browser();
    const imported: string[] = [];
    importDroppedSessions(b.target, async file => {
      imported.push(file.name);
    });
    expect(drop(b.listing, ['a.jpsession', 'data.csv', 'b.jpsession'])).toBe(
      true
    );
    await new Promise(resolve => setTimeout(resolve, 0));
    expect(imported).toEqual(['a.jpsession', 'b.jpsession']);
    expect(b.uploaded).toEqual(['data.csv']);
    expect(b.listed).toEqual([]);
    expect(b.listing.classList.contains('jp-mod-dropTarget')).toBe(false);
  });

  it('leaves a drop without session files to the file browser', () => {
    const b = browser();
    const importFile = jest.fn();
    const stop = importDroppedSessions(b.target, importFile);
    expect(drop(b.listing, ['data.csv'])).toBe(false);
    expect(b.listed).toEqual(['data.csv']);
    expect(importFile).not.toHaveBeenCalled();
    stop();
    drop(b.listing, ['a.jpsession']);
    expect(b.listed).toEqual(['data.csv', 'a.jpsession']);
    expect(importFile).not.toHaveBeenCalled();
  });
});

describe('Import Session…', () => {
  /** Choose `file` in the picker the command opens. */
  async function choose(file: File | null): Promise<void> {
    let input: HTMLInputElement | null = null;
    for (let i = 0; i < 50 && !input; i++) {
      await new Promise(resolve => setTimeout(resolve, 5));
      input = document.querySelector(`.${IMPORT_INPUT_CLASS}`);
    }
    expect(input?.accept).toBe('.jpsession');
    if (!file) {
      input!.dispatchEvent(new Event('cancel'));
      return;
    }
    Object.defineProperty(input, 'files', { value: [file] });
    input!.dispatchEvent(new Event('change'));
  }

  it('uploads the chosen file as a notebook in the browsed folder, and opens it', async () => {
    jest
      .spyOn(HTMLInputElement.prototype, 'click')
      .mockImplementation(() => undefined);
    FakeXhr.answer = sent => ({
      status: 201,
      body: {
        session: paused(UNTRUSTED, {
          path: decodeURIComponent(sent.url.split('/import/')[1])
        }),
        differences: ['no GPU here']
      }
    });
    const h = harness({ session: session() });
    const importing = h.commands.execute(SessionFileCommandIDs.importSession);
    await choose(new File([new Uint8Array([1, 2])], 'run.jpsession'));
    const field = await waitFor<HTMLInputElement>('.jp-Dialog input');
    expect(field.value).toBe('work/run.ipynb');
    await acceptDialog();
    await importing;

    expect(FakeXhr.sent.map(s => s.url)).toEqual([
      `${BASE}jupyter-pause/import/work/run.ipynb`
    ]);
    expect(h.opened).toEqual(['work/run.ipynb']);
    expect(h.manager.untrustedImport('work/run.ipynb')).toEqual({
      ...ORIGIN,
      differences: ['no GPU here']
    });
    expect(messages()).toEqual([
      'warning: Imported work/run.ipynb, paused: Resume asks you to trust it first. Differs here: no GPU here'
    ]);
    expect(document.querySelector(`.${IMPORT_INPUT_CLASS}`)).toBeNull();
  });

  it('imports nothing when the picker is cancelled', async () => {
    jest
      .spyOn(HTMLInputElement.prototype, 'click')
      .mockImplementation(() => undefined);
    const h = harness({ session: session() });
    const importing = h.commands.execute(SessionFileCommandIDs.importSession);
    await choose(null);
    await importing;
    expect(FakeXhr.sent).toEqual([]);
    expect(h.opened).toEqual([]);
  });

  it("says the server's refusal and opens nothing", async () => {
    jest
      .spyOn(HTMLInputElement.prototype, 'click')
      .mockImplementation(() => undefined);
    FakeXhr.answer = () => ({
      status: 409,
      body: {
        message:
          'work/run.ipynb exists already: import the session under another name'
      }
    });
    const h = harness({ session: session() });
    const importing = h.commands.execute(SessionFileCommandIDs.importSession);
    await choose(new File(['x'], 'run.jpsession'));
    await waitFor('.jp-Dialog input');
    await acceptDialog();
    await importing;
    expect(h.opened).toEqual([]);
    expect(messages()).toEqual([
      'error: Cannot import run.jpsession: work/run.ipynb exists already: import the session under another name'
    ]);
  });
});

/** The first element matching `selector`, once it is there. */
async function waitFor<T extends Element = Element>(
  selector: string
): Promise<T> {
  for (let i = 0; i < 100; i++) {
    const node = document.querySelector<T>(selector);
    if (node) {
      return node;
    }
    await new Promise(resolve => setTimeout(resolve, 5));
  }
  throw new Error(`${selector} never appeared`);
}
