import {
  command,
  type GroupSpec,
  parseCommandLine,
  parseDuration,
  parseFraction,
  parseInteger,
  parseKeyValue,
  parsePercent,
  parsePositive,
  parseSeconds,
  parseVersionId,
  parseVersionShare,
} from './args';
import { UsageError } from './cli-errors';

const TREE: GroupSpec<string> = {
  kind: 'group',
  name: 'infermesh',
  summary: 'root',
  flags: [],
  commands: [
    command({ name: 'up', summary: 'start', positionals: [], flags: [], handler: 'up' }),
    {
      kind: 'group',
      name: 'models',
      summary: 'models',
      flags: [
        { name: 'json', kind: 'switch', description: 'json' },
        { name: 'gateway', kind: 'value', placeholder: '<host:port>', description: 'where' },
      ],
      commands: [
        command({
          name: 'register',
          summary: 'register',
          positionals: [{ name: '<file>' }],
          flags: [
            { name: 'name', kind: 'value', placeholder: '<n>', required: true, description: 'name' },
            { name: 'pin', kind: 'switch', description: 'pin' },
            { name: 'label', kind: 'list', placeholder: '<k=v>', description: 'label' },
          ],
          handler: 'register',
        }),
        command({
          name: 'weights',
          summary: 'weights',
          positionals: [{ name: '<name>' }, { name: '<v=p>', variadic: true }],
          flags: [],
          handler: 'weights',
        }),
      ],
    },
  ],
};

function usageError(argv: string[]): UsageError {
  try {
    parseCommandLine(argv, TREE);
  } catch (error) {
    expect(error).toBeInstanceOf(UsageError);
    return error as UsageError;
  }
  throw new Error(`parsing ${argv.join(' ')} succeeded`);
}

describe(parseCommandLine.name, () => {
  it('picks the command from the leading words and reads --flag value, --flag=value, switches and repeated flags', () => {
    const sut = parseCommandLine(
      ['models', 'register', 'm.onnx', '--name', 'mlp', '--pin', '--label=team=a', '--label', 'task=b', '--json'],
      TREE,
    );

    expect(sut.path).toEqual(['models', 'register']);
    expect(sut.nodes.map((n) => n.name)).toEqual(['infermesh', 'models', 'register']);
    expect(sut.help).toBe(false);
    expect(sut.args.positionals).toEqual(['m.onnx']);
    expect(sut.args.value('name')).toBe('mlp');
    expect(sut.args.switch('pin')).toBe(true);
    expect(sut.args.switch('json')).toBe(true);
    expect(sut.args.list('label')).toEqual(['team=a', 'task=b']);
    expect(sut.args.value('gateway')).toBeUndefined();
  });

  it("accepts a group's flags between the group and the command, and takes everything after -- as arguments", () => {
    const sut = parseCommandLine(['models', '--gateway', 'h:1', 'register', '--name', 'x', '--', '--odd.onnx'], TREE);

    expect(sut.args.value('gateway')).toBe('h:1');
    expect(sut.args.positionals).toEqual(['--odd.onnx']);
  });

  it('takes negative numbers as arguments, not flags', () => {
    expect(parseCommandLine(['models', 'weights', 'mlp', '-1=2'], TREE).args.positionals).toEqual(['mlp', '-1=2']);
  });

  it.each([
    [['bogus'], 'unknown command "bogus"; the commands are up, models', []],
    [['models', 'bogus'], 'unknown command "bogus" of "models"; the commands are register, weights', ['models']],
    [
      ['models', 'register', 'f', '--name', 'x', '--bogus'],
      'unknown flag --bogus for "infermesh models register"',
      ['models', 'register'],
    ],
    [['--json', 'models', 'register'], 'unknown flag --json for "infermesh"', []],
    [['up', '--gateway=h:1'], 'unknown flag --gateway for "infermesh up"', ['up']],
    [['models', 'register', 'f', '--name'], '--name needs a value <n>', ['models', 'register']],
    [['models', 'register', 'f', '--name', '--pin'], '--name needs a value <n>', ['models', 'register']],
    [
      ['models', 'register', 'f', '--name', 'a', '--name', 'b'],
      '--name is given more than once',
      ['models', 'register'],
    ],
    [['models', 'register', 'f', '--name', 'a', '--pin=yes'], '--pin takes no value', ['models', 'register']],
    [['models', 'register', '--name', 'a'], 'missing <file>', ['models', 'register']],
    [['models', 'register', 'f'], '--name is required', ['models', 'register']],
    [['models', 'register', 'f', 'g', '--name', 'a'], 'unexpected argument "g"', ['models', 'register']],
    [['models', 'weights', 'mlp'], 'missing <v=p>', ['models', 'weights']],
    [['models'], 'missing command after "models"', ['models']],
    [
      ['models', 'register', 'f', '--name', 'a', '-x'],
      'unknown flag -x for "infermesh models register"',
      ['models', 'register'],
    ],
  ])('refuses %j: %s', (argv, message, path) => {
    const error = usageError(argv);

    expect(error.message).toBe(message);
    expect(error.path).toEqual(path);
    expect(error.exitCode).toBe(2);
  });

  it('asks for help with --help or -h anywhere, without checking arguments and required flags', () => {
    expect(parseCommandLine(['models', 'register', '--help'], TREE)).toMatchObject({
      help: true,
      path: ['models', 'register'],
    });
    expect(parseCommandLine(['-h', 'models'], TREE)).toMatchObject({ help: true, path: ['models'] });
    expect(parseCommandLine(['--help'], TREE)).toMatchObject({ help: true, path: [] });
  });
});

describe('argument values', () => {
  it('reads version ids, integers, seconds, percents, key=value pairs and version shares', () => {
    expect(parseVersionId('12', '--version')).toBe('12');
    expect(parseInteger('0', '--max-batch-size', 0)).toBe(0);
    expect(parseSeconds('2.5', '--timeout')).toBe(2.5);
    expect(parsePercent('12.5', '--percent')).toBe(12.5);
    expect(parsePercent('100%', '--percent')).toBe(100);
    expect(parseKeyValue('a=b=c', '--label')).toEqual(['a', 'b=c']);
    expect(parseKeyValue('a=', '--label')).toEqual(['a', '']);
    expect(parseVersionShare('3=25', '--variant')).toEqual({ version: '3', percent: 25 });
    expect([
      parseDuration('500ms', '--interval'),
      parseDuration('30s', '--interval'),
      parseDuration('1.5m', '--interval'),
    ]).toEqual([500, 30_000, 90_000]);
    expect([parseFraction('0', '--min-agreement', '0.99'), parseFraction('1', '--min-agreement', '0.99')]).toEqual([
      0, 1,
    ]);
    expect(parsePositive('1.2', '--max-p99-ratio', '1.2')).toBe(1.2);
  });

  it.each([
    [() => parseVersionId('0', '--version'), '--version must be a positive integer version id, got "0"'],
    [() => parseVersionId('v2', '--version'), '--version must be a positive integer version id, got "v2"'],
    [() => parseInteger('1.5', '--latest', 1), '--latest must be an integer of at least 1, got "1.5"'],
    [() => parseInteger('0', '--latest', 1), '--latest must be an integer of at least 1, got "0"'],
    [() => parseSeconds('0', '--timeout'), '--timeout must be a number of seconds above 0, got "0"'],
    [() => parseSeconds('soon', '--timeout'), '--timeout must be a number of seconds above 0, got "soon"'],
    [() => parsePercent('101', '--percent'), '--percent must be a percent from 0 to 100, got "101"'],
    [() => parsePercent('', '--percent'), '--percent must be a percent from 0 to 100, got ""'],
    [() => parseKeyValue('=b', '--label'), '--label must look like key=value, got "=b"'],
    [
      () => parseVersionShare('3=x', '--variant'),
      '--variant "3=x": the percent must be a percent from 0 to 100, got "x"',
    ],
    [
      () => parseDuration('60', '--interval'),
      '--interval must be a duration with its unit, such as 30s, 1m or 500ms, got "60"',
    ],
    [
      () => parseDuration('-1s', '--interval'),
      '--interval must be a duration with its unit, such as 30s, 1m or 500ms, got "-1s"',
    ],
    [
      () => parseDuration('0.5ms', '--interval'),
      '--interval must be a duration with its unit, such as 30s, 1m or 500ms, got "0.5ms"',
    ],
    [
      () => parseFraction('1.5', '--min-agreement', '0.99'),
      '--min-agreement must be a fraction from 0 to 1, such as 0.99, got "1.5"',
    ],
    [
      () => parsePositive('0', '--max-p99-ratio', '1.2'),
      '--max-p99-ratio must be a number above 0, such as 1.2, got "0"',
    ],
  ])('refuses a bad value: %#', (parse, message) => {
    expect(parse).toThrow(new UsageError(message));
  });
});
