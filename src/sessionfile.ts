/**
 * Session files ("take the session with you"), the logic without the DOM:
 * where an imported session came from, whether it is trusted, the notebook
 * path an import proposes, and the resume that asks for trust first.
 *
 * Restoring a session unpickles it, and unpickling runs code: the server
 * leaves an imported session untrusted, and refuses to resume it (409) until
 * the user trusts it.
 */
import { ServerConnection } from '@jupyterlab/services';

import type { ISession, PauseClient } from './api';
import { SESSION_FILE_EXTENSION, errorMessage } from './api';

/**
 * Who made an imported session, where and when, as the server says it.
 */
export interface IImportOrigin {
  /**
   * The user who exported it.
   */
  madeBy: string;
  /**
   * The host it was exported on.
   */
  madeOn: string;
  /**
   * When, `YYYY-MM-DD HH:MM` (the server's local time).
   */
  madeAt: string;
  /**
   * What differs here from where it was made, when known.
   */
  differences: string[];
}

/**
 * What the trust question shows.
 */
export interface ITrustRequest {
  /**
   * Where the session came from, or `null` when the server's words did not say.
   */
  origin: IImportOrigin | null;
  /**
   * The server's own words (the refusal of the resume), shown when `origin`
   * is `null`.
   */
  message: string;
}

/**
 * The start of the message of an imported session (`transfer.imported_message`).
 */
const IMPORTED_PREFIX = 'Paused (imported from ';

/**
 * `imported from USER on HOST, YYYY-MM-DD HH:MM` (the session message) or
 * `imported from USER on HOST (YYYY-MM-DD HH:MM)` (the refusal of a resume).
 */
const ORIGIN =
  /imported from (.+?) on (.+?)(?:, | \()(\d{4}-\d{2}-\d{2} \d{2}:\d{2})/;

/**
 * Where an imported session came from, read from the server's words.
 *
 * @param text A session message or the refusal of a resume.
 * @returns The origin, or `null` when the text names none.
 */
export function importOrigin(text: string): IImportOrigin | null {
  const match = ORIGIN.exec(text);
  if (!match) {
    return null;
  }
  const differs = /Differs here: (.+?)\.?$/s.exec(text);
  return {
    madeBy: match[1],
    madeOn: match[2],
    madeAt: match[3],
    differences: differs ? differs[1].split('; ').filter(Boolean) : []
  };
}

/**
 * Whether a session is an import, and whether its user trusts it, from its
 * message. The message says so only until a kernel is started for the
 * notebook (the server then offers to restore into it): see
 * `PauseManager.untrustedImport` for what the page remembers.
 *
 * @param session A session, or `null`.
 * @returns `untrusted`, `trusted`, or `null` (not an import, or not said).
 */
export function importState(
  session: ISession | null
): 'untrusted' | 'trusted' | null {
  const message = session?.message ?? '';
  if (!message.startsWith(IMPORTED_PREFIX)) {
    return null;
  }
  return message.includes('Trust it to resume') ? 'untrusted' : 'trusted';
}

/**
 * Whether an error is the server's refusal to resume an untrusted import.
 *
 * @param error An error of a resume.
 * @returns `true` for a 409 that asks to trust the session first.
 */
export function needsTrust(error: unknown): boolean {
  return (
    error instanceof ServerConnection.ResponseError &&
    error.response.status === 409 &&
    /trust it first/i.test(error.message)
  );
}

/**
 * The notebook path an import proposes: the file's name with `.ipynb` for
 * `.jpsession`, in `directory`.
 *
 * @param fileName The session file's name, e.g. `model.jpsession`.
 * @param directory The folder (relative to the server root; `''`: the root).
 * @returns E.g. `work/model.ipynb`.
 */
export function defaultImportPath(fileName: string, directory = ''): string {
  const base = fileName.split(/[\\/]/).pop() || '';
  let stem = base.toLowerCase().endsWith(SESSION_FILE_EXTENSION)
    ? base.slice(0, -SESSION_FILE_EXTENSION.length)
    : base.replace(/\.[^.]*$/, '');
  stem = stem.trim() || 'imported';
  const folder = directory.replace(/^\/+|\/+$/g, '');
  return folder ? `${folder}/${stem}.ipynb` : `${stem}.ipynb`;
}

/**
 * A path typed by the user, relative to the server root.
 *
 * @param path The path as typed.
 * @returns It without surrounding blanks and leading slashes.
 */
export function cleanNotebookPath(path: string): string {
  return path.trim().replace(/^\/+/, '');
}

/**
 * What `resumeTrusting` needs besides the client.
 */
export interface IResumeTrustingOptions {
  /**
   * From files into a kernel without a GPU, now.
   */
  onCpu?: boolean;
  /**
   * The origin of a session known to be an untrusted import: the question is
   * asked before any request.
   */
  untrusted?: IImportOrigin | null;
  /**
   * Ask the user whether to trust the session; resolves `true` to trust it.
   */
  confirm: (request: ITrustRequest) => Promise<boolean>;
  /**
   * Told of the session once trusted (before the resume is asked for).
   */
  onTrusted?: (session: ISession) => void;
}

/**
 * Resume a notebook; an untrusted import (known, or refused by the server
 * with 409) is trusted first, when the user says so.
 *
 * @param client The REST client.
 * @param path Notebook path relative to the server root.
 * @param options The question to ask, and how to resume.
 * @returns The session answered by the resume, or `null` when the user did
 *   not trust the session (nothing was resumed).
 * @throws What the trust or the resume threw (other than the refusal).
 */
export async function resumeTrusting(
  client: Pick<PauseClient, 'resume' | 'trust'>,
  path: string,
  options: IResumeTrustingOptions
): Promise<ISession | null> {
  const resume = () => client.resume(path, { onCpu: options.onCpu });
  let request: ITrustRequest;
  if (options.untrusted) {
    request = { origin: options.untrusted, message: '' };
  } else {
    try {
      return await resume();
    } catch (error) {
      if (!needsTrust(error)) {
        throw error;
      }
      const message = errorMessage(error);
      request = { origin: importOrigin(message), message };
    }
  }
  if (!(await options.confirm(request))) {
    return null;
  }
  const trusted = await client.trust(path);
  options.onTrusted?.(trusted);
  return resume();
}
