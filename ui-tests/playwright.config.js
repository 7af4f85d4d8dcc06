/**
 * Playwright configuration of the jupyter-pause ui-tests: galata's defaults,
 * Debian's chromium (browsers are never downloaded), no video (no ffmpeg).
 */
const baseConfig = require('@jupyterlab/galata/lib/playwright-config');

module.exports = {
  ...baseConfig,
  reporter: [['list'], ['html', { open: 'never' }]],
  timeout: 180 * 1000,
  retries: 0,
  workers: 1,
  expect: {
    timeout: 30 * 1000,
    toHaveScreenshot: { maxDiffPixelRatio: 0.02 }
  },
  use: {
    ...baseConfig.use,
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
    command: 'jlpm start',
    url: 'http://localhost:8888/lab',
    timeout: 120 * 1000,
    // A fresh server each run: paused sessions and GPU holders persist in the server.
    reuseExistingServer: false
  }
};
