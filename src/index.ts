import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ISettingRegistry } from '@jupyterlab/settingregistry';

import { PauseClient } from './api';

/**
 * The jupyter-pause plugin: loads the user preferences and checks that the
 * server extension answers. It shows nothing yet.
 */
const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-pause:plugin',
  description:
    'Pause a notebook to storage, free its hardware, and resume it later.',
  autoStart: true,
  optional: [ISettingRegistry],
  activate: async (
    app: JupyterFrontEnd,
    settingRegistry: ISettingRegistry | null
  ): Promise<void> => {
    const client = new PauseClient(app.serviceManager.serverSettings);
    const settingsLoaded = settingRegistry
      ? settingRegistry.load(plugin.id).catch(error => {
          console.error('jupyter-pause: failed to load settings.', error);
          return null;
        })
      : Promise.resolve(null);
    const statusChecked = client.getStatus().catch(error => {
      console.error('jupyter-pause: the status request failed.', error);
      return null;
    });
    await Promise.all([settingsLoaded, statusChecked]);
  }
};

export default plugin;
