import { z } from 'zod';
import { ConfigError } from './env';

/** Which traces are kept, as the standard OTEL_* variables say. */
export interface TracingSettings {
  /** Where spans go: the OTLP/HTTP traces URL (`<OTEL_EXPORTER_OTLP_ENDPOINT>/v1/traces`, or the traces endpoint itself). */
  tracesUrl: string;
  /** The share of new traces kept, 0 to 1. */
  ratio: number;
  /** Whether a call with a parent follows its parent's decision (parentbased_* samplers). */
  parentBased: boolean;
}

const SAMPLERS = [
  'always_on',
  'always_off',
  'traceidratio',
  'parentbased_always_on',
  'parentbased_always_off',
  'parentbased_traceidratio',
] as const;
const otlpUrl = () =>
  z.url({ protocol: /^https?$/, error: 'expected an http:// or https:// URL of an OTLP/HTTP receiver' }).optional();

/**
 * The standard OpenTelemetry variables infermesh reads (not prefixed: one collector per machine or
 * pod). Tracing is on when an OTLP endpoint is set, unless OTEL_SDK_DISABLED or OTEL_TRACES_EXPORTER=none;
 * spans go as OTLP http/protobuf, the exporter reading its other variables (headers, timeout,
 * compression, OTEL_BSP_*) itself.
 */
export const tracingShape = {
  OTEL_SDK_DISABLED: z.enum(['true', 'false'], { error: 'expected true or false' }).optional(),
  OTEL_TRACES_EXPORTER: z
    .enum(['otlp', 'none'], { error: 'infermesh exports traces as OTLP (otlp) or not at all (none)' })
    .optional(),
  OTEL_EXPORTER_OTLP_ENDPOINT: otlpUrl(),
  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: otlpUrl(),
  OTEL_EXPORTER_OTLP_PROTOCOL: z
    .literal('http/protobuf', { error: 'infermesh exports OTLP over http/protobuf only' })
    .optional(),
  OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: z
    .literal('http/protobuf', { error: 'infermesh exports OTLP over http/protobuf only' })
    .optional(),
  OTEL_TRACES_SAMPLER: z
    .enum(SAMPLERS, { error: `expected one of ${SAMPLERS.join(', ')}` })
    .default('parentbased_traceidratio'),
  OTEL_TRACES_SAMPLER_ARG: z.coerce.number().min(0).max(1).optional(),
};

/** The tracing settings of a parsed environment (tracingShape); undefined: tracing off. */
export function tracingSettings(env: Record<string, unknown>): TracingSettings | undefined {
  const endpoint = env['OTEL_EXPORTER_OTLP_TRACES_ENDPOINT'] ?? env['OTEL_EXPORTER_OTLP_ENDPOINT'];
  if (endpoint === undefined || env['OTEL_SDK_DISABLED'] === 'true' || env['OTEL_TRACES_EXPORTER'] === 'none')
    return undefined;
  const sampler = env['OTEL_TRACES_SAMPLER'] as (typeof SAMPLERS)[number];
  const arg = env['OTEL_TRACES_SAMPLER_ARG'] as number | undefined;
  if (arg !== undefined && !sampler.endsWith('traceidratio')) {
    throw new ConfigError([
      `OTEL_TRACES_SAMPLER_ARG: a ratio applies to traceidratio and parentbased_traceidratio, not to ${sampler}`,
    ]);
  }
  const ratio = sampler.endsWith('always_on') ? 1 : sampler.endsWith('always_off') ? 0 : (arg ?? 1);
  const tracesUrl =
    (env['OTEL_EXPORTER_OTLP_TRACES_ENDPOINT'] as string | undefined) ??
    `${(endpoint as string).replace(/\/$/, '')}/v1/traces`;
  return { tracesUrl, ratio, parentBased: sampler.startsWith('parentbased_') };
}
