import { JupyterFrontEnd } from '@jupyterlab/application';
import {
  Dialog,
  MainAreaWidget,
  Notification,
  WidgetTracker,
  showDialog
} from '@jupyterlab/apputils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';

import { errorMessage } from './api';
import { pauseIcon, resumeIcon, timelineIcon } from './icons';
import { NotebookPauseModel, PauseManager } from './model';
import { TimelinePanel } from './timeline';
import { IPauseView, formatBytes, formatDuration } from './view';

/**
 * The command ids of jupyter-pause.
 */
export const CommandIDs = {
  /**
   * Pause the current notebook (checkpoint, stop the kernel, free its GPU).
   */
  pause: 'jupyter-pause:pause',
  /**
   * Resume the current notebook.
   */
  resume: 'jupyter-pause:resume',
  /**
   * Pause or resume, whichever applies (the toolbar button).
   */
  toggle: 'jupyter-pause:toggle',
  /**
   * Write a checkpoint of the current notebook now.
   */
  checkpoint: 'jupyter-pause:checkpoint',
  /**
   * Open the timeline panel of the current notebook.
   */
  timeline: 'jupyter-pause:timeline'
} as const;

/**
 * Register the commands.
 *
 * @param app The application.
 * @param manager The shared manager.
 * @param tracker The notebook tracker.
 * @param timelines The tracker of timeline panels (restored on reload).
 */
export function addCommands(
  app: JupyterFrontEnd,
  manager: PauseManager,
  tracker: INotebookTracker,
  timelines: WidgetTracker<MainAreaWidget<TimelinePanel>>
): void {
  const { commands, shell } = app;

  const current = (): NotebookPauseModel | null => {
    const panel: NotebookPanel | null = tracker.currentWidget;
    return panel ? manager.modelFor(panel) : null;
  };
  const view = (): IPauseView | null => current()?.view ?? null;
  const isEnabled = (test: (v: IPauseView) => boolean) => () => {
    const v = view();
    return !!v && test(v);
  };
  /** A tooltip saying why a command is disabled, or what it does. */
  const caption = (what: string) => () => {
    const v = view();
    if (!v) {
      return `${what} (open a notebook first)`;
    }
    if (v.state === 'unavailable') {
      return `${what}: unavailable. ${v.tooltip}`;
    }
    return what;
  };

  const pause = async (): Promise<void> => {
    const model = current();
    if (!model) {
      return;
    }
    if (manager.settings.confirmBeforePause) {
      const answer = await showDialog({
        title: 'Pause this notebook?',
        body:
          `The state of ${model.path} is saved to disk, its kernel is stopped ` +
          'and its GPU released for others. Resume brings the variables back.',
        buttons: [
          Dialog.cancelButton(),
          Dialog.okButton({ label: 'Pause', ariaLabel: 'Pause notebook' })
        ]
      });
      if (!answer.button.accept) {
        return;
      }
    }
    try {
      model.setSession(await manager.client.pause(model.path));
    } catch (error) {
      Notification.error(`Cannot pause: ${errorMessage(error)}`, {
        autoClose: 8000
      });
      await model.refresh();
    }
  };

  const resume = async (): Promise<void> => {
    const model = current();
    if (!model) {
      return;
    }
    try {
      model.setSession(await manager.client.resume(model.path));
    } catch (error) {
      Notification.error(`Cannot resume: ${errorMessage(error)}`, {
        autoClose: 8000
      });
      await model.refresh();
    }
  };

  commands.addCommand(CommandIDs.pause, {
    label: 'Pause Notebook',
    caption: caption('Save the kernel state, stop the kernel and free its GPU'),
    icon: pauseIcon,
    isEnabled: isEnabled(v => v.canPause),
    execute: pause
  });

  commands.addCommand(CommandIDs.resume, {
    label: 'Resume Notebook',
    caption: caption('Start a kernel and restore the saved state'),
    icon: resumeIcon,
    isEnabled: isEnabled(v => v.canResume),
    execute: resume
  });

  commands.addCommand(CommandIDs.toggle, {
    label: () => (view()?.canResume ? 'Resume' : 'Pause'),
    caption: () => {
      const v = view();
      if (v?.canResume) {
        return caption('Resume this notebook: restore its saved state')();
      }
      return caption('Pause this notebook: save its state and free its GPU')();
    },
    icon: () => (view()?.canResume ? resumeIcon : pauseIcon),
    isEnabled: isEnabled(v => v.canPause || v.canResume),
    execute: () => (view()?.canResume ? resume() : pause())
  });

  commands.addCommand(CommandIDs.checkpoint, {
    label: 'Checkpoint Notebook Now',
    caption: caption('Save the kernel state now; the kernel keeps running'),
    isEnabled: isEnabled(v => v.canCheckpoint),
    execute: async () => {
      const model = current();
      if (!model) {
        return;
      }
      try {
        const answer = await manager.client.checkpoint(model.path);
        model.setSession(answer.session);
        const r = answer.result;
        const skipped = Object.keys(r.skipped || {}).length;
        Notification.success(
          `Checkpoint ${r.checkpoint_id}: ${r.saved.length} variables, ` +
            `${formatBytes(r.bytes_written)} written in ${formatDuration(r.seconds)}` +
            (skipped ? `; ${skipped} skipped` : ''),
          { autoClose: 5000 }
        );
      } catch (error) {
        Notification.error(`Checkpoint failed: ${errorMessage(error)}`, {
          autoClose: 8000
        });
      }
    }
  });

  commands.addCommand(CommandIDs.timeline, {
    label: 'Show Pause Timeline',
    caption: caption('GPU time and pause/resume events of this notebook'),
    icon: timelineIcon,
    isEnabled: () => {
      const v = view();
      return !!v && v.state !== 'unavailable';
    },
    execute: async args => {
      const path = (args.path as string) || current()?.path;
      if (!path) {
        return;
      }
      let widget = timelines.find(w => w.content.path === path);
      if (!widget) {
        const content = new TimelinePanel(manager, path);
        widget = new MainAreaWidget({ content });
        widget.id = `jupyter-pause-timeline-${encodeURIComponent(path)}`;
        widget.title.icon = timelineIcon;
        widget.title.label = content.title.label;
        widget.title.closable = true;
        void timelines.add(widget);
        shell.add(widget, 'main', { mode: 'split-right' });
      }
      shell.activateById(widget.id);
      await widget.content.refresh();
    }
  });

  const notify = () => commands.notifyCommandChanged();
  manager.changed.connect(notify);
  tracker.currentChanged.connect(notify);
}
