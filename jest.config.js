const jestJupyterLab = require('@jupyterlab/testing/lib/jest-config');

// ES modules shipped untranspiled by JupyterLab's dependencies.
const esModules = [
  '@codemirror',
  '@jupyter/ydoc',
  '@jupyter/react-components',
  '@jupyter/web-components',
  '@microsoft/fast-[a-z-]+',
  'exenv-es6',
  '@jupyterlab/',
  'lib0',
  'nanoid',
  'vscode-ws-jsonrpc',
  'y-protocols',
  'y-websocket',
  'yjs'
].join('|');

const baseConfig = jestJupyterLab(__dirname);

module.exports = {
  ...baseConfig,
  automock: false,
  // Crawl only the sources: the .venv and the built labextension hold other package.json files.
  roots: ['<rootDir>/src'],
  collectCoverageFrom: [
    'src/**/*.{ts,tsx}',
    '!src/**/*.d.ts',
    '!src/__tests__/**'
  ],
  coverageReporters: ['lcov', 'text'],
  // A floor that only goes up: raise it when tests cover more, never lower it.
  coverageThreshold: {
    global: { statements: 73, branches: 76, functions: 76, lines: 74 }
  },
  testRegex: 'src/.*/.*.spec.ts[x]?$',
  transformIgnorePatterns: [`/node_modules/(?!${esModules}).+`]
};
