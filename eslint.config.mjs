// Lint gates that catch real bugs: type-aware rules (floating promises, exhaustive switches) and
// Nx module boundaries (apps depend on libs, never on each other; libs never on apps).
import nx from '@nx/eslint-plugin';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  {
    ignores: ['dist/**', 'dist-test/**', 'node_modules/**', 'libs/proto/src/gen/**', 'coverage/**', '.nx/**', '.infermesh/**', '**/*.js', '**/*.mjs'],
  },
  ...tseslint.configs.recommendedTypeChecked,
  {
    files: ['**/*.ts'],
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    plugins: { '@nx': nx },
    rules: {
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/no-misused-promises': ['error', { checksVoidReturn: { arguments: false } }],
      '@typescript-eslint/switch-exhaustiveness-check': ['error', { considerDefaultExhaustiveForUnions: true }],
      '@typescript-eslint/require-await': 'off',
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      '@typescript-eslint/consistent-type-imports': ['error', { fixStyle: 'inline-type-imports', disallowTypeAnnotations: false }],
      // The error catalogue is closed: an error is made by its reason's factory, which pairs it with its
      // gRPC code and HTTP status (Errors.queueFull(…), libs/grpc/src/error-catalogue.ts), never by hand.
      'no-restricted-syntax': [
        'error',
        {
          selector: "NewExpression[callee.name='RpcError']",
          message: 'Make errors with Errors.<reason>(message) from libs/grpc (the error catalogue), not new RpcError(code, …).',
        },
      ],
      'no-restricted-imports': [
        'error',
        {
          paths: [
            {
              name: '@nestjs/common',
              importNames: [
                'HttpException',
                'BadRequestException',
                'NotFoundException',
                'PayloadTooLargeException',
                'UnauthorizedException',
                'ForbiddenException',
                'UnsupportedMediaTypeException',
                'InternalServerErrorException',
              ],
              message: "HTTP errors come from the error catalogue too: throw Errors.<reason>(…) from libs/grpc.",
            },
          ],
        },
      ],
      '@nx/enforce-module-boundaries': [
        'error',
        {
          allow: [],
          depConstraints: [
            { sourceTag: 'type:app', onlyDependOnLibsWithTags: ['type:lib'] },
            { sourceTag: 'type:lib', onlyDependOnLibsWithTags: ['type:lib'] },
            { sourceTag: 'type:e2e', onlyDependOnLibsWithTags: ['type:lib'] },
            { sourceTag: 'scope:shared', onlyDependOnLibsWithTags: ['scope:shared'] },
            { sourceTag: 'scope:ops', onlyDependOnLibsWithTags: ['scope:shared', 'scope:ops'] },
            { sourceTag: 'scope:testing', onlyDependOnLibsWithTags: ['scope:shared', 'scope:ops', 'scope:testing'] },
            { sourceTag: 'scope:gateway', onlyDependOnLibsWithTags: ['scope:shared'] },
            { sourceTag: 'scope:registry', onlyDependOnLibsWithTags: ['scope:shared'] },
            { sourceTag: 'scope:router', onlyDependOnLibsWithTags: ['scope:shared'] },
            { sourceTag: 'scope:batcher', onlyDependOnLibsWithTags: ['scope:shared'] },
            { sourceTag: 'scope:worker', onlyDependOnLibsWithTags: ['scope:shared'] },
            { sourceTag: 'scope:cache', onlyDependOnLibsWithTags: ['scope:shared'] },
          ],
        },
      ],
    },
  },
  {
    // Specs of shared libraries may use the test helpers (a real redis-server, free ports); their
    // production code may not.
    files: ['libs/**/*.spec.ts'],
    rules: {
      '@nx/enforce-module-boundaries': [
        'error',
        {
          allow: [],
          depConstraints: [
            { sourceTag: 'type:lib', onlyDependOnLibsWithTags: ['type:lib'] },
            { sourceTag: 'scope:shared', onlyDependOnLibsWithTags: ['scope:shared', 'scope:testing'] },
            { sourceTag: 'scope:ops', onlyDependOnLibsWithTags: ['scope:shared', 'scope:ops', 'scope:testing'] },
            { sourceTag: 'scope:testing', onlyDependOnLibsWithTags: ['scope:shared', 'scope:ops', 'scope:testing'] },
          ],
        },
      ],
    },
  },
  {
    // A service's specs and its test harnesses (`*.testing.ts`, `testing/`) may use the test helpers;
    // the service's own code may not, so that none of them runs in production.
    files: ['services/**/*.spec.ts', 'services/**/*.testing.ts', 'services/**/testing/**/*.ts'],
    rules: {
      '@nx/enforce-module-boundaries': [
        'error',
        {
          allow: [],
          depConstraints: [
            { sourceTag: 'type:app', onlyDependOnLibsWithTags: ['type:lib'] },
            ...['gateway', 'registry', 'router', 'batcher', 'worker', 'cache'].map((service) => ({
              sourceTag: `scope:${service}`,
              onlyDependOnLibsWithTags: ['scope:shared', 'scope:testing'],
            })),
          ],
        },
      ],
    },
  },
  {
    // Rebuilding a received status is the one place that pairs a code by hand; specs build any status
    // an upstream could send, transport failures without a reason included.
    files: ['libs/grpc/src/rpc-error.ts', '**/*.spec.ts'],
    rules: { 'no-restricted-syntax': 'off' },
  },
  {
    // The specs of the tools (the CLI) and their harnesses (`testing/`) may use the test helpers
    // (libs/testing's FakeRegistry, ManualClock); the tools' own code may not.
    files: ['tools/**/*.spec.ts', 'tools/**/testing/**/*.ts'],
    rules: {
      '@nx/enforce-module-boundaries': [
        'error',
        {
          allow: [],
          depConstraints: [
            { sourceTag: 'type:app', onlyDependOnLibsWithTags: ['type:lib'] },
            { sourceTag: 'scope:ops', onlyDependOnLibsWithTags: ['scope:shared', 'scope:ops', 'scope:testing'] },
          ],
        },
      ],
    },
  },
  {
    files: ['**/*.spec.ts', 'test/**/*.ts'],
    rules: {
      '@typescript-eslint/no-non-null-assertion': 'off',
      '@typescript-eslint/no-unsafe-assignment': 'off',
      '@typescript-eslint/no-unsafe-member-access': 'off',
    },
  },
);
