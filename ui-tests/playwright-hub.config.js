/**
 * The galata test through JupyterHub (hub.spec.ts): the same browser and
 * settings as playwright.config.js, against a real JupyterHub with the shipped
 * deploy/jupyterhub/jupyterhub_config.py in its demo mode
 * (tests/hub_lab.py, run from the repository root). The Hub listens on the
 * free port playwright.config.js chose (UI_TESTS_PORT).
 */
const base = require('./playwright.config');

// The Hub binds 127.0.0.1 (not ::1, which "localhost" may mean to node).
const baseURL = `http://127.0.0.1:${process.env.UI_TESTS_PORT}`;

module.exports = {
  ...base,
  testIgnore: [],
  testMatch: 'hub.spec.ts',
  timeout: 240 * 1000,
  use: { ...base.use, baseURL },
  reporter: [
    ['list'],
    ['html', { open: 'never', outputFolder: 'playwright-report-hub' }]
  ],
  webServer: {
    ...base.webServer,
    // exec: Playwright's SIGTERM reaches the launcher, and Playwright waits
    // until it has stopped the Hub and the user's server.
    command:
      'cd .. && exec python -m tests.hub_lab >ui-tests/server-hub.log 2>&1',
    url: `${baseURL}/hub/health`,
    timeout: 120 * 1000,
    gracefulShutdown: { signal: 'SIGTERM', timeout: 60 * 1000 }
  }
};
