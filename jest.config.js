// Unit specs live beside the code (*.spec.ts, and those of the benchmarks' helpers under test/bench); e2e specs under test/e2e start the real services
// from dist/ (npm test builds first) and a real redis-server.
const shared = {
  // Node's environment, with the host realm's typed arrays so onnxruntime-node's outputs pass its own instanceof checks.
  testEnvironment: '<rootDir>/libs/testing/src/ort-jest-environment.ts',
  transform: {
    '^.+\\.ts$': ['ts-jest', { tsconfig: '<rootDir>/tsconfig.spec.json' }],
  },
  moduleNameMapper: {
    '^@infermesh/([^/]+)$': '<rootDir>/libs/$1/src',
    '^@infermesh/([^/]+)/(.*)$': '<rootDir>/libs/$1/src/$2',
  },
};

/** @type {import('jest').Config} */
module.exports = {
  projects: [
    {
      ...shared,
      displayName: 'unit',
      testMatch: ['<rootDir>/{libs,services,tools}/**/*.spec.ts', '<rootDir>/test/bench/**/*.spec.ts'],
    },
    {
      ...shared,
      displayName: 'e2e',
      testMatch: ['<rootDir>/test/e2e/**/*.e2e.spec.ts'],
      setupFilesAfterEnv: ['<rootDir>/test/e2e/support/e2e-setup.ts'],
    },
  ],
  testTimeout: 30_000,
};
