import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parse } from 'yaml';
import { EnvoyApi } from './envoy-api-check';

const TESTDATA = join(__dirname, '..', '..', '..', 'envoy', 'testdata');
const BROKEN = join(TESTDATA, 'broken');

describe(EnvoyApi.name, () => {
  let sut: EnvoyApi;

  beforeAll(() => {
    sut = EnvoyApi.load();
  });

  it('passes a valid bootstrap', () => {
    expect(sut.checkBootstrap(parse(readFileSync(join(TESTDATA, 'valid-bootstrap.yaml'), 'utf8')))).toEqual([]);
  });

  const fixtures = readdirSync(BROKEN).filter((f) => f.endsWith('.yaml'));

  it('has broken fixtures to fail', () => {
    expect(fixtures.length).toBeGreaterThanOrEqual(10);
  });

  it.each(fixtures)('fails broken/%s, naming the path each of its "# expect:" lines gives', (file) => {
    const text = readFileSync(join(BROKEN, file), 'utf8');
    const expected = [...text.matchAll(/^# expect: (.+)$/gm)].map((match) => match[1]!);
    if (expected.length === 0) throw new Error(`${file} has no "# expect:" line`);

    const problems = sut.checkBootstrap(parse(text));

    for (const line of expected) expect(problems.join('\n')).toContain(line);
  });

  it('checks a typed config by its @type, and a type it cannot find is a problem', () => {
    const filter = (typed: object) => ({ name: 'f', typed_config: typed });
    const type = 'envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter';

    expect(
      sut.check(
        type,
        filter({
          '@type': 'type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault',
          abort: { grpc_status: 14, percentage: { numerator: 10 } },
        }),
      ),
    ).toEqual([]);
    expect(
      sut.check(
        type,
        filter({
          '@type': 'type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault',
          abort: { grpc_status: 14, percentage: { numerator: 10, denominator: 'MILLIONS' } },
        }),
      ),
    ).toEqual([
      'typed_config.abort.percentage.denominator: "MILLIONS" is not a value of envoy.type.v3.FractionalPercent.DenominatorType (HUNDRED, TEN_THOUSAND, MILLION)',
    ]);
    expect(sut.check(type, filter({ abort: {} }))).toEqual([
      'typed_config.@type: expected "type.googleapis.com/<message>", got undefined',
    ]);
  });

  it('applies validation rules to values a field holds by default: a missing required string fails', () => {
    expect(sut.check('envoy.config.cluster.v3.Cluster', { connect_timeout: '1s' })).toEqual([
      'name: must be at least 1 characters (the field is missing)',
    ]);
  });

  it('checks JSON types: durations, 64-bit integers as strings, booleans, lists', () => {
    const cluster = {
      name: 'c',
      connect_timeout: '0.25s',
      per_connection_buffer_limit_bytes: 1024,
      respect_dns_ttl: true,
      dns_lookup_family: 'V4_ONLY',
    };
    expect(sut.check('envoy.config.cluster.v3.Cluster', cluster)).toEqual([]);
    expect(
      sut.check('envoy.config.cluster.v3.Cluster', {
        ...cluster,
        connect_timeout: '250ms',
        respect_dns_ttl: 'yes',
        health_checks: {},
      }),
    ).toEqual([
      'connect_timeout: expected a duration such as "1.5s", got "250ms"',
      'respect_dns_ttl: expected true or false, got "yes"',
      'health_checks: expected a list, got {}',
    ]);
  });

  it('names a type it does not know', () => {
    expect(sut.check('envoy.config.nothing.v3.Nothing', {})).toEqual([
      "(document): envoy.config.nothing.v3.Nothing is not a type of Envoy's v3 API",
    ]);
  });
});
