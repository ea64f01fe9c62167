// Lint gates that catch real bugs: type-aware rules (floating promises, exhaustive switches) and
// Nx module boundaries (apps depend on libs, never on each other; libs never on apps).
import nx from '@nx/eslint-plugin';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  {
    ignores: ['dist/**', 'node_modules/**', 'libs/proto/src/gen/**', 'coverage/**', '.nx/**', '.infermesh/**', '**/*.js', '**/*.mjs'],
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
    files: ['**/*.spec.ts', 'test/**/*.ts'],
    rules: {
      '@typescript-eslint/no-non-null-assertion': 'off',
      '@typescript-eslint/no-unsafe-assignment': 'off',
      '@typescript-eslint/no-unsafe-member-access': 'off',
    },
  },
);
