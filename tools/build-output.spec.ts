import { join, relative } from 'node:path';
import * as ts from 'typescript';

const root = join(__dirname, '..');

/** Every source file of the repository that a tsconfig compiles: its own files and all they import. */
function compiledFiles(config: string): string[] {
  const parsed = ts.getParsedCommandLineOfConfigFile(
    join(root, config),
    {},
    {
      ...ts.sys,
      onUnRecoverableConfigFileDiagnostic: (diagnostic) => {
        throw new Error(ts.flattenDiagnosticMessageText(diagnostic.messageText, '\n'));
      },
    },
  );
  if (parsed === undefined) throw new Error(`${config} could not be read`);
  const program = ts.createProgram({ rootNames: parsed.fileNames, options: { ...parsed.options, noEmit: true } });
  return program
    .getSourceFiles()
    .map((file) => relative(root, file.fileName))
    .filter((file) => !file.startsWith('..') && !file.startsWith('node_modules/') && !file.includes('/node_modules/'));
}

/** Code that only tests use: specs, test harnesses, the shared test helpers and the benchmarks. */
const TESTING = [/\.spec\.ts$/, /\.testing\.ts$/, /(^|\/)testing\//, /^test\//];

describe('the production build (tsconfig.build.json)', () => {
  const files = compiledFiles('tsconfig.build.json');

  it('compiles every service, library and tool into dist/', () => {
    for (const main of ['gateway', 'registry', 'router', 'batcher', 'worker', 'cache']) {
      expect(files).toContain(`services/${main}/src/main.ts`);
    }
    expect(files).toContain('tools/cli/src/main.ts');
  });

  it('holds no testing code, not even through an import from product code', () => {
    expect(files.filter((file) => TESTING.some((pattern) => pattern.test(file)))).toEqual([]);
  });
});

describe('the benchmarks build (tsconfig.bench.json)', () => {
  it('compiles the benchmarks and their test support into dist-test/, apart from the product', () => {
    const files = compiledFiles('tsconfig.bench.json');
    expect(files).toContain('test/bench/src/main.ts');
    expect(files).toContain('libs/testing/src/index.ts');
    expect(
      ts.readConfigFile(join(root, 'tsconfig.bench.json'), (path) => ts.sys.readFile(path)).config.compilerOptions
        .outDir,
    ).toBe('dist-test');
  });
});
