import { Token } from '@lumino/coreutils';

import { PauseManager } from './model';

/**
 * The shared pause manager: the REST client, the server's availability and
 * the state of every open notebook.
 */
export const IPauseManager = new Token<PauseManager>(
  'jupyter-pause:IPauseManager',
  'The jupyter-pause manager: pause state of the open notebooks.'
);
