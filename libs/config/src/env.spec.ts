import { z } from 'zod';
import {
  address,
  addressList,
  byteSize,
  ConfigError,
  host,
  logLevel,
  nonNegativeInt,
  optionalPort,
  parseEnv,
  port,
  positiveInt,
  redisUrl,
} from './env';

function configError(fn: () => unknown): ConfigError {
  try {
    fn();
  } catch (error) {
    if (error instanceof ConfigError) return error;
    throw error;
  }
  throw new Error('expected a ConfigError');
}

const shape = {
  SVC_PORT: port(50051),
  SVC_HOST: host('0.0.0.0'),
  SVC_TIMEOUT_MS: positiveInt(1_000),
  SVC_RETRIES: nonNegativeInt(3),
  SVC_UPSTREAM: address('127.0.0.1:50052'),
  SVC_WORKERS: addressList('127.0.0.1:50055'),
  SVC_LOG_LEVEL: logLevel(),
  REDIS_URL: redisUrl(),
};

describe('parseEnv', () => {
  it('applies every default when nothing is set', () => {
    expect(parseEnv(shape, {})).toEqual({
      SVC_PORT: 50051,
      SVC_HOST: '0.0.0.0',
      SVC_TIMEOUT_MS: 1_000,
      SVC_RETRIES: 3,
      SVC_UPSTREAM: '127.0.0.1:50052',
      SVC_WORKERS: ['127.0.0.1:50055'],
      SVC_LOG_LEVEL: 'info',
    });
  });

  it('reads and converts set variables', () => {
    const config = parseEnv(shape, {
      SVC_PORT: '8080',
      SVC_HOST: 'localhost',
      SVC_TIMEOUT_MS: '250',
      SVC_RETRIES: '0',
      SVC_UPSTREAM: 'registry:50051',
      SVC_WORKERS: 'w1:1,w2:2',
      SVC_LOG_LEVEL: 'debug',
      REDIS_URL: 'rediss://cache:6380/0',
    });

    expect(config).toEqual({
      SVC_PORT: 8080,
      SVC_HOST: 'localhost',
      SVC_TIMEOUT_MS: 250,
      SVC_RETRIES: 0,
      SVC_UPSTREAM: 'registry:50051',
      SVC_WORKERS: ['w1:1', 'w2:2'],
      SVC_LOG_LEVEL: 'debug',
      REDIS_URL: 'rediss://cache:6380/0',
    });
  });

  it('ignores variables outside the shape', () => {
    expect(parseEnv({ SVC_PORT: port(1) }, { SVC_PORT: '2', PATH: '/bin', OTHER: 'x' })).toEqual({ SVC_PORT: 2 });
  });

  it('counts empty strings as unset, so defaults apply', () => {
    expect(parseEnv(shape, { SVC_PORT: '', SVC_HOST: '', SVC_WORKERS: '', SVC_LOG_LEVEL: '', REDIS_URL: '' })).toEqual(
      parseEnv(shape, {}),
    );
  });

  it('counts blank strings as unset rather than as 0', () => {
    expect(parseEnv(shape, { SVC_PORT: ' ', SVC_RETRIES: '  ', SVC_TIMEOUT_MS: '\t' })).toMatchObject({
      SVC_PORT: 50051,
      SVC_RETRIES: 3,
      SVC_TIMEOUT_MS: 1_000,
    });
  });

  it('names every bad variable and its value in one error', () => {
    const error = configError(() =>
      parseEnv(shape, {
        SVC_PORT: 'http',
        SVC_TIMEOUT_MS: '0',
        SVC_RETRIES: '-1',
        SVC_UPSTREAM: 'registry',
        SVC_LOG_LEVEL: 'verbose',
        REDIS_URL: 'http://cache:6379',
        SVC_HOST: 'fine',
      }),
    );

    const byVariable = new Map(error.problems.map((p) => [p.slice(0, p.indexOf(':')), p]));
    expect([...byVariable.keys()].sort()).toEqual([
      'REDIS_URL',
      'SVC_LOG_LEVEL',
      'SVC_PORT',
      'SVC_RETRIES',
      'SVC_TIMEOUT_MS',
      'SVC_UPSTREAM',
    ]);
    expect(byVariable.get('SVC_PORT')).toContain('(got "http")');
    expect(byVariable.get('SVC_TIMEOUT_MS')).toContain('(got "0")');
    expect(byVariable.get('SVC_RETRIES')).toContain('(got "-1")');
    expect(byVariable.get('SVC_UPSTREAM')).toContain('expected host:port (got "registry")');
    expect(byVariable.get('SVC_LOG_LEVEL')).toContain('(got "verbose")');
    expect(byVariable.get('REDIS_URL')).toContain('expected a redis:// or rediss:// URL (got "http://cache:6379")');
    for (const problem of error.problems) expect(error.message).toContain(problem);
    expect(error.message.startsWith('invalid configuration:\n  - ')).toBe(true);
  });

  it('names a required variable that is missing, without a value', () => {
    const error = configError(() => parseEnv({ SVC_API_KEYS: z.string().min(1) }, {}));

    expect(error.problems).toHaveLength(1);
    expect(error.problems[0]).toMatch(/^SVC_API_KEYS: /);
    expect(error.problems[0]).not.toContain('(got');
  });
});

describe('port', () => {
  const parse = (value: string) => parseEnv({ P: port(80) }, { P: value }).P;

  it('accepts 0 to 65535', () => {
    expect(parse('0')).toBe(0);
    expect(parse('65535')).toBe(65535);
  });

  it.each(['65536', '-1', '80.5', 'eighty'])('refuses %p', (value) => {
    expect(configError(() => parse(value)).problems[0]).toContain(`P: `);
  });
});

describe('optionalPort', () => {
  const parse = (value: string | undefined) => parseEnv({ P: optionalPort() }, { P: value }).P;

  it('is undefined when unset and reads 1 to 65535', () => {
    expect(parse(undefined)).toBeUndefined();
    expect(parse('1')).toBe(1);
    expect(parse('15006')).toBe(15006);
    expect(parse('65535')).toBe(65535);
  });

  it.each(['0', '65536', '-1', '80.5', 'eighty'])('refuses %p, naming the variable', (value) => {
    const problem = configError(() => parse(value)).problems[0]!;

    expect(problem.startsWith('P: ')).toBe(true);
    expect(problem).toContain(`(got "${value}")`);
  });
});

describe('positiveInt and nonNegativeInt', () => {
  it('refuses 0 as positive but accepts it as non-negative', () => {
    expect(() => parseEnv({ N: positiveInt(1) }, { N: '0' })).toThrow(ConfigError);
    expect(parseEnv({ N: nonNegativeInt(1) }, { N: '0' }).N).toBe(0);
  });

  it('refuses fractions', () => {
    expect(() => parseEnv({ N: positiveInt(1) }, { N: '1.5' })).toThrow(ConfigError);
    expect(() => parseEnv({ N: nonNegativeInt(1) }, { N: '2.5' })).toThrow(ConfigError);
  });
});

describe('address', () => {
  const parse = (value: string) => parseEnv({ A: address('x:1') }, { A: value }).A;

  it.each(['registry:50051', '10.0.0.7:1', 'my-host.svc.cluster.local:65535', '[::1]:50051', '[fe80::1]:8080'])(
    'accepts %p',
    (value) => {
      expect(parse(value)).toBe(value);
    },
  );

  it.each([
    'registry',
    ':50051',
    'registry:',
    'registry:port',
    'a b:1',
    'http://registry:50051',
    'registry:123456',
    'registry:65536',
    'registry:99999',
  ])('refuses %p', (value) => {
    expect(configError(() => parse(value)).problems[0]).toContain(`(got ${JSON.stringify(value)})`);
  });
});

describe('addressList', () => {
  const parse = (value: string | undefined) => parseEnv({ L: addressList('a:1, b:2') }, { L: value }).L;

  it('splits on commas, trims and drops empty entries', () => {
    expect(parse(' w1:50055 , w2:50056,,w3:50057, ')).toEqual(['w1:50055', 'w2:50056', 'w3:50057']);
  });

  it('splits the default the same way', () => {
    expect(parse(undefined)).toEqual(['a:1', 'b:2']);
  });

  it('refuses a list with a bad entry, showing the whole value', () => {
    const error = configError(() => parse('w1:50055,w2'));

    expect(error.problems).toHaveLength(1);
    expect(error.problems[0]).toBe('L: expected host:port (got "w1:50055,w2")');
  });

  it('refuses an entry with a port above 65535', () => {
    expect(() => parse('w1:50055,w2:70000')).toThrow(ConfigError);
  });

  it('refuses a list of nothing but commas', () => {
    expect(configError(() => parse(' , ,')).problems[0]).toMatch(/^L: .*\(got " , ,"\)$/);
  });
});

describe('redisUrl', () => {
  it('is optional and accepts redis:// and rediss://', () => {
    const schema = { R: redisUrl() };
    expect(parseEnv(schema, {}).R).toBeUndefined();
    expect(parseEnv(schema, { R: 'redis://localhost:6379' }).R).toBe('redis://localhost:6379');
    expect(() => parseEnv(schema, { R: 'localhost:6379' })).toThrow(ConfigError);
  });
});

describe('byteSize', () => {
  const shape = { SIZE: byteSize('1GiB') };

  it.each([
    ['1048576', 1_048_576],
    ['512MiB', 512 * 2 ** 20],
    ['2GB', 2e9],
    ['1.5GiB', 1.5 * 2 ** 30],
    ['64 kib', 65_536],
  ])('reads %s as %d bytes', (value, bytes) => {
    expect(parseEnv(shape, { SIZE: value }).SIZE).toBe(bytes);
  });

  it('defaults to its fallback', () => {
    expect(parseEnv(shape, {}).SIZE).toBe(2 ** 30);
  });

  it.each(['0', '-1MiB', '12 parsecs', 'MiB', '1e9'])('refuses %s, naming the variable', (value) => {
    expect(() => parseEnv(shape, { SIZE: value })).toThrow(
      /SIZE: expected a positive size such as 536870912, 512MiB or 2GB/,
    );
  });
});
