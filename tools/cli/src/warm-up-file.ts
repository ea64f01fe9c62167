import { create, type MessageInitShape } from '@bufbuild/protobuf';
import { readFile, stat } from 'node:fs/promises';
import {
  type WarmUp,
  type WarmUpInputSchema,
  WarmUpSchema,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import {
  DATATYPE_NAMES,
  DataType,
  datatypeFromName,
  elementCount,
  jsonToRaw,
  TensorDataError,
} from '@infermesh/tensors';
import { CommandFailure } from './cli-errors';
import { formatBytes } from './output/format';

/** The largest warm-up file `models register --warmup` reads (the registry holds at most 1 MiB of its data). */
export const MAX_WARM_UP_FILE_BYTES = 8 * 1024 * 1024;

const INPUT_KEYS = new Set(['name', 'datatype', 'shape', 'data', 'zero_data', 'random_data']);
const SAMPLE_KEYS = new Set(['name', 'inputs']);

type InputInit = MessageInitShape<typeof WarmUpInputSchema>;

/**
 * Reads a warm-up file for `models register --warmup` (or a calibration file, in the same form, for
 * `models quantize --calibration`; `flag` names it in errors): JSON of named tensors as in a KServe v2
 * request, either one sample `{"inputs":[...]}` or several `{"samples":[{"name":"16 kHz","inputs":[...]}]}`.
 * Each input has a `name`, a concrete `shape` and either `data` (flat or nested, as KServe JSON, with
 * its `datatype`) or `"zero_data": true` or `"random_data": true` (the datatype is then optional: the
 * model's). Refuses, naming the file and the entry, anything else; the registry checks the samples
 * against the model.
 */
export async function readWarmUpFile(file: string, flag = '--warmup'): Promise<WarmUp> {
  let text: string;
  try {
    const info = await stat(file);
    if (!info.isFile()) throw new CommandFailure(`${flag} ${file} is not a file`);
    if (info.size > MAX_WARM_UP_FILE_BYTES) {
      throw new CommandFailure(
        `${flag} ${file} has ${formatBytes(info.size)}, above the limit of ${formatBytes(MAX_WARM_UP_FILE_BYTES)}; give large inputs as "zero_data" or "random_data"`,
      );
    }
    text = await readFile(file, 'utf8');
  } catch (error) {
    if (error instanceof CommandFailure) throw error;
    const code = (error as NodeJS.ErrnoException).code;
    throw new CommandFailure(
      `cannot read ${flag} ${file}: ${code === 'ENOENT' ? 'no such file' : error instanceof Error ? error.message : String(error)}`,
    );
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (error) {
    throw new CommandFailure(`${flag} ${file} is not JSON: ${error instanceof Error ? error.message : String(error)}`);
  }
  return parseWarmUp(json, `${flag} ${file}`);
}

/** The warm-up a parsed warm-up file declares; `source` names the file in messages. */
export function parseWarmUp(json: unknown, source: string): WarmUp {
  const fail = (where: string, message: string) => new CommandFailure(`${source}: ${where}${message}`);
  if (!isObject(json)) throw fail('', 'expected an object with "inputs" (one sample) or "samples"');
  const samples: unknown[] =
    'samples' in json ? asArray(json['samples'], () => fail('', '"samples" must be an array')) : [json];
  if ('samples' in json && 'inputs' in json) throw fail('', 'give either "inputs" (one sample) or "samples", not both');
  return create(WarmUpSchema, {
    samples: samples.map((sample, s) => {
      const at = 'samples' in json ? `samples[${s}]` : '';
      if (!isObject(sample)) throw fail(at, `${at === '' ? '' : ' '}must be an object with "inputs"`);
      unknownKeys(sample, SAMPLE_KEYS, (key) =>
        fail(at, `${at === '' ? '' : ': '}unknown key "${key}"; a sample has "name" and "inputs"`),
      );
      const name = sample['name'] ?? '';
      if (typeof name !== 'string') throw fail(at, `${at === '' ? '' : ': '}"name" must be a string`);
      const inputs = asArray(sample['inputs'], () =>
        fail(at, `${at === '' ? '' : ': '}"inputs" must be an array of named tensors`),
      );
      return {
        name,
        inputs: inputs.map((input, i) => parseInput(input, `${at === '' ? '' : `${at}.`}inputs[${i}]`, fail)),
      };
    }),
  });
}

function parseInput(input: unknown, at: string, fail: (where: string, message: string) => CommandFailure): InputInit {
  if (!isObject(input))
    throw fail(at, ' must be an object with "name", "shape" and "data", "zero_data" or "random_data"');
  const name = input['name'];
  if (typeof name !== 'string' || name === '') throw fail(at, ': "name" must be the name of a model input');
  const where = `${at} ("${name}")`;
  unknownKeys(input, INPUT_KEYS, (key) =>
    fail(where, `: unknown key "${key}"; an input has ${[...INPUT_KEYS].map((k) => `"${k}"`).join(', ')}`),
  );
  const shape = input['shape'];
  if (!Array.isArray(shape) || !shape.every((d) => Number.isSafeInteger(d) && (d as number) >= 0)) {
    throw fail(where, ': "shape" must be an array of sizes (integers, 0 or more), the concrete shape of the sample');
  }
  const dims = (shape as number[]).map(BigInt);
  let datatype = DataType.UNSPECIFIED;
  if (input['datatype'] !== undefined) {
    const named = typeof input['datatype'] === 'string' ? datatypeFromName(input['datatype']) : undefined;
    if (named === undefined) throw fail(where, `: "datatype" must be one of ${DATATYPE_NAMES.join(', ')}`);
    datatype = named;
  }
  const given = ['data', 'zero_data', 'random_data'].filter((key) => input[key] !== undefined);
  if (given.length !== 1) throw fail(where, ': give exactly one of "data", "zero_data": true or "random_data": true');
  if (input['data'] !== undefined) {
    if (datatype === DataType.UNSPECIFIED) throw fail(where, ': "data" needs its "datatype"');
    try {
      return {
        name,
        datatype,
        shape: dims,
        contents: { case: 'data', value: jsonToRaw(name, datatype, input['data'], elementCount(dims)) },
      };
    } catch (error) {
      if (error instanceof TensorDataError) throw fail(at, `: ${error.message}`);
      throw error;
    }
  }
  const key = given[0]!;
  if (input[key] !== true) throw fail(where, `: "${key}" must be true`);
  return {
    name,
    datatype,
    shape: dims,
    contents: key === 'zero_data' ? { case: 'zeroData', value: true } : { case: 'randomData', value: true },
  };
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function asArray(value: unknown, fail: () => CommandFailure): unknown[] {
  if (!Array.isArray(value)) throw fail();
  return value;
}

function unknownKeys(
  object: Record<string, unknown>,
  known: ReadonlySet<string>,
  fail: (key: string) => CommandFailure,
): void {
  const unknown = Object.keys(object).find((key) => !known.has(key));
  if (unknown !== undefined) throw fail(unknown);
}
