import { ConfigError } from '@infermesh/config';
import { loadCliConfig } from './cli.config';

describe(loadCliConfig.name, () => {
  it('takes a key the gateway can read back from its key list', () => {
    expect(loadCliConfig({ INFERMESH_API_KEY: 'im_0123456789abcdefABCDEF' }).apiKey).toBe('im_0123456789abcdefABCDEF');
  });

  it.each([
    ['short', /at least 16 characters/],
    ['has,a-comma-in-the-key', /commas, colons or spaces/],
    ['has:a-colon-in-the-key', /commas, colons or spaces/],
    ['has a space in the key', /commas, colons or spaces/],
  ])('refuses INFERMESH_API_KEY "%s", naming the variable', (key, message) => {
    expect(() => loadCliConfig({ INFERMESH_API_KEY: key })).toThrow(ConfigError);
    expect(() => loadCliConfig({ INFERMESH_API_KEY: key })).toThrow(message);
    expect(() => loadCliConfig({ INFERMESH_API_KEY: key })).toThrow(/INFERMESH_API_KEY/);
  });

  it('checks the tracing variables the services will read before anything starts', () => {
    expect(loadCliConfig({}).tracing).toBeUndefined();
    expect(
      loadCliConfig({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318', OTEL_TRACES_SAMPLER_ARG: '0.1' }).tracing,
    ).toEqual({
      tracesUrl: 'http://collector:4318/v1/traces',
      ratio: 0.1,
      parentBased: true,
    });
    expect(() =>
      loadCliConfig({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318', OTEL_TRACES_SAMPLER_ARG: 'half' }),
    ).toThrow(/OTEL_TRACES_SAMPLER_ARG/);
  });
});
