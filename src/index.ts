import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  ICommandPalette,
  IToolbarWidgetRegistry,
  MainAreaWidget,
  WidgetTracker
} from '@jupyterlab/apputils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { ITranslator, nullTranslator } from '@jupyterlab/translation';
import { CommandToolbarButton } from '@jupyterlab/ui-components';

// The toolbar factory must return its chip at once, and the chip module is
// loaded at startup anyway (the status bar item renders with it).
// eslint-disable-next-line jupyter/prefer-lazy-imports
import { PauseChip } from './chip';
import { CommandIDs, addCommands } from './commands';
// The manager is the service this plugin provides: activation needs it at once.
// eslint-disable-next-line jupyter/prefer-lazy-imports
import { DEFAULT_SETTINGS, IPauseSettings, PauseManager } from './model';
// A status item is registered with its widget: activation needs it at once.
// eslint-disable-next-line jupyter/prefer-lazy-imports
import { PauseStatusItem } from './statusbar';
import {
  SessionFileCommandIDs,
  addSessionFileCommands
} from './sessionfilecommands';
import { TimelinePanel } from './timeline';
import { IPauseManager } from './tokens';

export { CommandIDs } from './commands';
export { SessionFileCommandIDs } from './sessionfilecommands';
export { IPauseManager } from './tokens';

/**
 * Name of the status chip in the notebook toolbar (see `schema/plugin.json`).
 */
const CHIP_TOOLBAR_ITEM = 'jupyter-pause-status';

/**
 * Name of the pause/resume button in the notebook toolbar (see `schema/plugin.json`).
 */
const TOGGLE_TOOLBAR_ITEM = 'jupyter-pause-toggle';

/**
 * The translation domain of jupyter_pause.
 */
const TRANSLATION_DOMAIN = 'jupyter_pause';

/**
 * The core plugin: the manager, the commands, the toolbar chip and the
 * timeline panel.
 */
const plugin: JupyterFrontEndPlugin<PauseManager> = {
  id: 'jupyter-pause:plugin',
  description:
    'Pause a notebook to storage, free its hardware, and resume it later.',
  autoStart: true,
  provides: IPauseManager,
  requires: [INotebookTracker],
  optional: [
    ISettingRegistry,
    IToolbarWidgetRegistry,
    ICommandPalette,
    ILayoutRestorer,
    ITranslator
  ],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    settingRegistry: ISettingRegistry | null,
    toolbarRegistry: IToolbarWidgetRegistry | null,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null,
    translator: ITranslator | null
  ): PauseManager => {
    const trans = (translator ?? nullTranslator).load(TRANSLATION_DOMAIN);
    const manager = new PauseManager(
      app.serviceManager.serverSettings,
      app.serviceManager.sessions,
      trans
    );
    void manager.checkServer();

    if (settingRegistry) {
      settingRegistry
        .load(plugin.id)
        .then(settings => {
          const update = () => {
            manager.settings = {
              ...DEFAULT_SETTINGS,
              ...(settings.composite as Partial<IPauseSettings>)
            };
          };
          update();
          settings.changed.connect(update);
        })
        .catch(error => {
          console.error('jupyter-pause: failed to load settings.', error);
        });
    }

    const timelines = new WidgetTracker<MainAreaWidget<TimelinePanel>>({
      namespace: 'jupyter-pause-timeline'
    });
    if (restorer) {
      void restorer.restore(timelines, {
        command: CommandIDs.timeline,
        args: widget => ({ path: widget.content.path }),
        name: widget => widget.content.path
      });
    }

    addCommands(app, manager, tracker, timelines, trans);
    addSessionFileCommands(app, manager, tracker, trans);

    if (toolbarRegistry) {
      // The pause/resume button shows its label ("Pause" or "Resume") next to
      // its icon: the default factory of a command with an icon shows no label.
      toolbarRegistry.addFactory<NotebookPanel>(
        'Notebook',
        TOGGLE_TOOLBAR_ITEM,
        () =>
          new CommandToolbarButton({
            commands: app.commands,
            id: CommandIDs.toggle
          })
      );
      toolbarRegistry.addFactory<NotebookPanel>(
        'Notebook',
        CHIP_TOOLBAR_ITEM,
        panel =>
          new PauseChip(manager.modelFor(panel), app.commands, {
            resume: CommandIDs.resume,
            accept: CommandIDs.accept,
            resumeOnCpu: CommandIDs.resumeOnCpu,
            cancel: CommandIDs.cancelResume,
            timeline: CommandIDs.timeline
          })
      );
    }
    // Track every notebook (activity reports, reconnection after a resume),
    // whether or not its toolbar shows the chip.
    tracker.widgetAdded.connect((_, panel) => {
      manager.modelFor(panel);
    });

    if (palette) {
      const category = trans.__('Notebook Pause');
      for (const command of [
        CommandIDs.pause,
        CommandIDs.resume,
        CommandIDs.checkpoint,
        CommandIDs.timeline,
        SessionFileCommandIDs.exportSession,
        SessionFileCommandIDs.importSession,
        SessionFileCommandIDs.trustSession
      ]) {
        palette.addItem({ command, category });
      }
    }
    return manager;
  }
};

/**
 * The status bar item: the pause state of the current notebook.
 */
const statusBarPlugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-pause:status-bar',
  description:
    'Shows the pause state of the current notebook in the status bar.',
  autoStart: true,
  requires: [IPauseManager, INotebookTracker, IStatusBar],
  activate: (
    app: JupyterFrontEnd,
    manager: PauseManager,
    tracker: INotebookTracker,
    statusBar: IStatusBar
  ): void => {
    const item = new PauseStatusItem(manager, tracker);
    item.node.addEventListener('click', () => {
      void app.commands.execute(CommandIDs.timeline);
    });
    const changed = manager.changed;
    statusBar.registerStatusItem(statusBarPlugin.id, {
      item,
      align: 'left',
      rank: 4,
      isActive: () =>
        manager.settings.showStatusBarItem && tracker.currentWidget !== null,
      activeStateChanged: changed
    });
  }
};

export default [plugin, statusBarPlugin];
