import { JupyterFrontEnd } from '@jupyterlab/application';
import {
  Dialog,
  MainAreaWidget,
  Notification,
  WidgetTracker,
  showDialog
} from '@jupyterlab/apputils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { TranslationBundle } from '@jupyterlab/translation';

import { errorMessage } from './api';
import { pauseConsequence } from './backendnotes';
import { pauseIcon, resumeIcon, timelineIcon } from './icons';
import { NotebookPauseModel, PauseManager } from './model';
import { resumeTrusting } from './sessionfile';
import { confirmTrust } from './sessionfilecommands';
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
   * While a resume waits for a GPU: restore from files on CPU now instead.
   */
  resumeOnCpu: 'jupyter-pause:resume-on-cpu',
  /**
   * Cancel a resume that waits for a GPU (the notebook stays paused).
   */
  cancelResume: 'jupyter-pause:cancel-resume',
  /**
   * Carry on after an incomplete restore (retention may delete old checkpoints again).
   */
  accept: 'jupyter-pause:accept',
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
 * @param trans The translation bundle of the labels, captions and messages.
 */
export function addCommands(
  app: JupyterFrontEnd,
  manager: PauseManager,
  tracker: INotebookTracker,
  timelines: WidgetTracker<MainAreaWidget<TimelinePanel>>,
  trans: TranslationBundle
): void {
  const { commands, shell } = app;
  /** The commands take no arguments. */
  const noArgs = {
    args: { type: 'object' as const, properties: {} }
  };

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
      return trans.__('%1 (open a notebook first)', what);
    }
    if (v.state === 'unavailable') {
      return trans.__('%1: unavailable. %2', what, v.tooltip);
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
        title: trans.__('Pause this notebook?'),
        body: pauseConsequence(model.path, manager.status, trans),
        buttons: [
          Dialog.cancelButton({ label: trans.__('Cancel') }),
          Dialog.okButton({
            label: trans.__('Pause'),
            ariaLabel: trans.__('Pause notebook')
          })
        ]
      });
      if (!answer.button.accept) {
        return;
      }
    }
    try {
      model.setSession(await manager.client.pause(model.path));
    } catch (error) {
      Notification.error(trans.__('Cannot pause: %1', errorMessage(error)), {
        autoClose: 8000
      });
      await model.refresh();
    }
  };

  const resume = async (onCpu = false): Promise<void> => {
    const model = current();
    if (!model) {
      return;
    }
    const path = model.path;
    try {
      // An imported session is restored only once the user trusts it.
      const session = await resumeTrusting(manager.client, path, {
        onCpu,
        untrusted: model.untrustedImport,
        confirm: request => {
          if (request.origin) {
            // The chip says it from now on, whatever the answer.
            manager.noteUntrustedImport(path, request.origin);
          }
          return confirmTrust(request, trans);
        },
        onTrusted: trusted => {
          manager.forgetImport(path);
          model.setSession(trusted);
        }
      });
      if (session) {
        model.setSession(session);
      }
    } catch (error) {
      Notification.error(trans.__('Cannot resume: %1', errorMessage(error)), {
        autoClose: 8000
      });
      await model.refresh();
    }
  };

  commands.addCommand(CommandIDs.pause, {
    label: trans.__('Pause Notebook'),
    caption: caption(
      trans.__('Save the kernel state, stop the kernel and free its GPU')
    ),
    describedBy: noArgs,
    icon: pauseIcon,
    isEnabled: isEnabled(v => v.canPause),
    execute: pause
  });

  commands.addCommand(CommandIDs.resume, {
    label: trans.__('Resume Notebook'),
    caption: caption(trans.__('Start a kernel and restore the saved state')),
    describedBy: noArgs,
    icon: resumeIcon,
    isEnabled: isEnabled(v => v.canResume),
    execute: () => resume()
  });

  const waiting = isEnabled(v => v.state === 'waiting-for-resources');

  commands.addCommand(CommandIDs.resumeOnCpu, {
    label: trans.__('Restore on CPU Now'),
    caption: caption(
      trans.__(
        'Stop waiting for a GPU: restore the saved state from files into a kernel without a GPU now (it gets one at its next pause and resume)'
      )
    ),
    describedBy: noArgs,
    isEnabled: () => waiting() && (manager.status?.restores_on_cpu ?? false),
    execute: () => resume(true)
  });

  commands.addCommand(CommandIDs.cancelResume, {
    label: trans.__('Cancel Resume'),
    caption: caption(
      trans.__('Stop waiting for a GPU; the notebook stays paused')
    ),
    describedBy: noArgs,
    isEnabled: waiting,
    execute: async () => {
      const model = current();
      if (!model) {
        return;
      }
      try {
        model.setSession(await manager.client.cancel(model.path));
      } catch (error) {
        Notification.error(trans.__('Cannot cancel: %1', errorMessage(error)), {
          autoClose: 8000
        });
        await model.refresh();
      }
    }
  });

  commands.addCommand(CommandIDs.accept, {
    label: trans.__('Accept Incomplete Restore'),
    caption: caption(
      trans.__(
        'Carry on without what the restore could not bring back; old checkpoints may then be deleted by retention again'
      )
    ),
    describedBy: noArgs,
    isEnabled: () => !!current()?.session?.hold,
    execute: async () => {
      const model = current();
      if (!model) {
        return;
      }
      try {
        model.setSession(await manager.client.accept(model.path));
      } catch (error) {
        Notification.error(trans.__('Cannot accept: %1', errorMessage(error)), {
          autoClose: 8000
        });
        await model.refresh();
      }
    }
  });

  commands.addCommand(CommandIDs.toggle, {
    label: () => (view()?.canResume ? trans.__('Resume') : trans.__('Pause')),
    caption: () => {
      const v = view();
      if (v?.canResume) {
        return caption(
          trans.__('Resume this notebook: restore its saved state')
        )();
      }
      return caption(
        trans.__('Pause this notebook: save its state and free its GPU')
      )();
    },
    describedBy: noArgs,
    icon: () => (view()?.canResume ? resumeIcon : pauseIcon),
    className: 'jp-JupyterPause-Toggle',
    isEnabled: isEnabled(v => v.canPause || v.canResume),
    execute: () => (view()?.canResume ? resume() : pause())
  });

  commands.addCommand(CommandIDs.checkpoint, {
    label: trans.__('Checkpoint Notebook Now'),
    caption: caption(
      trans.__('Save the kernel state now; the kernel keeps running')
    ),
    describedBy: noArgs,
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
        const saved = trans._n(
          'Checkpoint %2: %1 variable, %3 written in %4',
          'Checkpoint %2: %1 variables, %3 written in %4',
          r.saved.length,
          r.checkpoint_id,
          formatBytes(r.bytes_written),
          formatDuration(r.seconds, trans)
        );
        Notification.success(
          skipped ? trans.__('%1; %2 skipped', saved, skipped) : saved,
          { autoClose: 5000 }
        );
      } catch (error) {
        Notification.error(
          trans.__('Checkpoint failed: %1', errorMessage(error)),
          { autoClose: 8000 }
        );
      }
    }
  });

  commands.addCommand(CommandIDs.timeline, {
    label: trans.__('Show Pause Timeline'),
    caption: caption(
      trans.__('GPU time and pause/resume events of this notebook')
    ),
    describedBy: {
      args: {
        type: 'object',
        properties: {
          path: {
            type: 'string',
            description: trans.__(
              'The notebook path (default: the current notebook)'
            )
          }
        }
      }
    },
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
      const widget =
        timelines.find(w => w.content.path === path) ?? openTimeline(path);
      shell.activateById(widget.id);
      await widget.content.refresh();
    }
  });

  /** A new timeline panel, tracked and added to the main area. */
  const openTimeline = (path: string): MainAreaWidget<TimelinePanel> => {
    const content = new TimelinePanel(manager, path);
    const widget = new MainAreaWidget({ content });
    widget.id = `jupyter-pause-timeline-${encodeURIComponent(path)}`;
    widget.title.icon = timelineIcon;
    widget.title.label = content.title.label;
    widget.title.closable = true;
    void timelines.add(widget);
    shell.add(widget, 'main', { mode: 'split-right' });
    return widget;
  };

  const notify = () => commands.notifyCommandChanged();
  manager.changed.connect(notify);
  tracker.currentChanged.connect(notify);
}
