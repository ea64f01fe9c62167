import { type Env, host, logLevel, parseEnv, redisUrl } from '@infermesh/config';
import { z } from 'zod';

const shape = {
  INFERMESH_API_KEY: z.string().min(16, 'must be at least 16 characters').optional(),
  INFERMESH_HOST: host('127.0.0.1'),
  INFERMESH_DATA_DIR: z.string().min(1).default('.infermesh'),
  INFERMESH_DEMO_MODELS: z
    .string()
    .default('mlp,tiny,multi-io,classifier')
    .transform((v) => v.split(',').map((s) => s.trim()).filter((s) => s.length > 0)),
  INFERMESH_LOG_LEVEL: logLevel(),
  INFERMESH_READY_TIMEOUT_MS: z.coerce.number().int().positive().default(120_000),
  REDIS_URL: redisUrl(),
};

/** The launcher's configuration (`infermesh up`), validated once. */
export function loadCliConfig(env: Env) {
  const e = parseEnv(shape, env);
  return {
    apiKey: e.INFERMESH_API_KEY,
    host: e.INFERMESH_HOST,
    dataDir: e.INFERMESH_DATA_DIR,
    demoModels: e.INFERMESH_DEMO_MODELS,
    logLevel: e.INFERMESH_LOG_LEVEL,
    readyTimeoutMs: e.INFERMESH_READY_TIMEOUT_MS,
    redisUrl: e.REDIS_URL,
  };
}

export type CliConfig = ReturnType<typeof loadCliConfig>;
