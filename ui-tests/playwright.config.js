/**
 * Playwright configuration of the jupyter-pause ui-tests: galata's defaults,
 * Debian's chromium (browsers are never downloaded), no video (no ffmpeg),
 * and a server on a free port (a `make lab` on 8888 may be running).
 */
const { execFileSync } = require('child_process');
const baseConfig = require('@jupyterlab/galata/lib/playwright-config');

/**
 * A port nobody listens on, chosen once per run: the workers Playwright
 * starts load this file again and inherit the variable.
 */
function uiTestsPort() {
  if (!process.env.UI_TESTS_PORT) {
    process.env.UI_TESTS_PORT = execFileSync('python3', [
      '-c',
      'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
    ])
      .toString()
      .trim();
  }
  return process.env.UI_TESTS_PORT;
}

const baseURL = `http://localhost:${uiTestsPort()}`;

module.exports = {
  ...baseConfig,
  reporter: [['list'], ['html', { open: 'never' }]],
  // Against the kernel-pod backend: playwright-kernel-pods.config.js; through
  // JupyterHub: playwright-hub.config.js.
  testIgnore: ['kernel-pods.spec.ts', 'hub.spec.ts'],
  timeout: 180 * 1000,
  retries: 0,
  workers: 1,
  expect: {
    timeout: 30 * 1000,
    toHaveScreenshot: { maxDiffPixelRatio: 0.02 }
  },
  use: {
    ...baseConfig.use,
    baseURL,
    timezoneId: 'UTC',
    viewport: { width: 1280, height: 800 },
    trace: 'retain-on-failure',
    video: 'off',
    launchOptions: {
      executablePath: process.env.CHROMIUM_PATH || '/usr/bin/chromium',
      args: [
        '--headless',
        '--no-sandbox',
        '--disable-gpu',
        '--disable-quic',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
        '--no-first-run',
        '--disable-dev-shm-usage'
      ]
    }
  },
  webServer: {
    // The server's log (~2,000 lines a run) goes to server.log, not among the
    // test results: `make test` prints its tail when the stage fails.
    command: 'jlpm start >server.log 2>&1',
    url: `${baseURL}/lab`,
    timeout: 120 * 1000,
    // A fresh server each run: paused sessions and GPU holders persist in the server.
    reuseExistingServer: false
  }
};
