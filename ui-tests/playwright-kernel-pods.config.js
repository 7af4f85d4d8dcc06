/**
 * The kernel-pods galata test (kernel-pods.spec.ts): the same browser and
 * settings as playwright.config.js, against JupyterLab on the kernel-pod
 * backend with the real control plane of the cluster tests
 * (tests/cluster/kernel_pods_lab.py, run from the repository root).
 */
const base = require('./playwright.config');

module.exports = {
  ...base,
  testIgnore: [],
  testMatch: 'kernel-pods.spec.ts',
  timeout: 300 * 1000,
  reporter: [
    ['list'],
    ['html', { open: 'never', outputFolder: 'playwright-report-kernel-pods' }]
  ],
  webServer: {
    ...base.webServer,
    command:
      'cd .. && python -m tests.cluster.kernel_pods_lab >ui-tests/server-kernel-pods.log 2>&1',
    timeout: 240 * 1000,
    gracefulShutdown: { signal: 'SIGTERM', timeout: 60 * 1000 }
  }
};
