import { ConfigError, parseEnv } from './env';
import { tracingSettings, tracingShape } from './tracing-env';

const tracingOf = (env: Record<string, string>) => tracingSettings(parseEnv(tracingShape, env));
const refusal = (env: Record<string, string>) => {
  try {
    tracingOf(env);
  } catch (error) {
    if (error instanceof ConfigError) return error.message;
    throw error;
  }
  throw new Error('accepted');
};

describe('tracing settings (the standard OTEL_* variables)', () => {
  const endpoint = { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318' };

  it('is off without an OTLP endpoint, or when disabled', () => {
    expect(tracingOf({})).toBeUndefined();
    expect(tracingOf({ ...endpoint, OTEL_SDK_DISABLED: 'true' })).toBeUndefined();
    expect(tracingOf({ ...endpoint, OTEL_TRACES_EXPORTER: 'none' })).toBeUndefined();
  });

  it('samples every trace by default, following a caller that decided', () => {
    expect(tracingOf(endpoint)).toEqual({ tracesUrl: 'http://collector:4318/v1/traces', ratio: 1, parentBased: true });
    expect(tracingOf({ OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'https://collector/traces' })).toEqual({
      tracesUrl: 'https://collector/traces',
      ratio: 1,
      parentBased: true,
    });
  });

  it('reads the sampler and its ratio', () => {
    expect(tracingOf({ ...endpoint, OTEL_TRACES_SAMPLER_ARG: '0.01' })).toMatchObject({
      ratio: 0.01,
      parentBased: true,
    });
    expect(
      tracingOf({ ...endpoint, OTEL_TRACES_SAMPLER: 'traceidratio', OTEL_TRACES_SAMPLER_ARG: '0.5' }),
    ).toMatchObject({ ratio: 0.5, parentBased: false });
    expect(tracingOf({ ...endpoint, OTEL_TRACES_SAMPLER: 'parentbased_always_off' })).toMatchObject({
      ratio: 0,
      parentBased: true,
    });
    expect(tracingOf({ ...endpoint, OTEL_TRACES_SAMPLER: 'always_on' })).toMatchObject({
      ratio: 1,
      parentBased: false,
    });
  });

  it('refuses what it cannot honour, naming the variable', () => {
    expect(refusal({ ...endpoint, OTEL_TRACES_SAMPLER_ARG: '2' })).toContain('OTEL_TRACES_SAMPLER_ARG');
    expect(refusal({ ...endpoint, OTEL_TRACES_SAMPLER: 'jaeger_remote' })).toContain(
      'OTEL_TRACES_SAMPLER: expected one of always_on',
    );
    expect(refusal({ ...endpoint, OTEL_TRACES_SAMPLER: 'always_on', OTEL_TRACES_SAMPLER_ARG: '0.5' })).toContain(
      'a ratio applies to traceidratio',
    );
    expect(refusal({ OTEL_EXPORTER_OTLP_ENDPOINT: 'collector:4318' })).toContain('OTEL_EXPORTER_OTLP_ENDPOINT');
    expect(refusal({ ...endpoint, OTEL_EXPORTER_OTLP_PROTOCOL: 'grpc' })).toContain('http/protobuf only');
    expect(refusal({ ...endpoint, OTEL_TRACES_EXPORTER: 'zipkin' })).toContain('OTEL_TRACES_EXPORTER');
  });
});
