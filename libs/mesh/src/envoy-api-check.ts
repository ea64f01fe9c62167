import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import * as protobuf from 'protobufjs';

/**
 * A strict check of Envoy configuration against Envoy's own v3 API protos (they ship inside
 * @grpc/grpc-js-xds under deps/), since Envoy itself cannot be installed here: unknown fields,
 * wrong JSON types, undefined or deprecated enum values, deprecated fields, oneofs set twice,
 * the protoc-gen-validate rules (`(validate.rules)`, `(validate.required)`) that Envoy enforces on
 * load, typed `Any` configs resolved by their @type and checked in turn; then, for a bootstrap,
 * every cross-reference (each cluster a route, listener or gRPC service names is defined; names and
 * listener ports are unique). Every problem names its path in the document.
 */

type Json = unknown;
type Rules = Record<string, unknown>;

/** Where the protos live: @grpc/grpc-js-xds's deps/ (Envoy's API, xds, validate, googleapis), then protobufjs's google/protobuf. */
function protoRoots(): string[] {
  const xds = dirname(require.resolve('@grpc/grpc-js-xds/package.json'));
  const pbjs = dirname(require.resolve('protobufjs/package.json'));
  return [...['envoy-api', 'xds', 'protoc-gen-validate', 'googleapis'].map((d) => join(xds, 'deps', d)), pbjs];
}

const TYPE_URL_PREFIX = 'type.googleapis.com/';

/** Merges the options a descriptor element carries under one name ("(validate.rules)") into one object. */
function parsedOption(element: protobuf.ReflectionObject, name: string): Rules | undefined {
  const parsed = (element as unknown as { parsedOptions?: Record<string, unknown>[] }).parsedOptions;
  let merged: Rules | undefined;
  for (const option of parsed ?? []) {
    if (name in option) merged = { ...merged, ...(option[name] as Rules) };
  }
  const plain: unknown = element.options?.[name];
  if (merged === undefined && plain !== undefined)
    return typeof plain === 'object' ? (plain as Rules) : { value: plain };
  return merged;
}

const isObject = (value: Json): value is Record<string, Json> =>
  typeof value === 'object' && value !== null && !Array.isArray(value);

const INT_RANGES: Readonly<Record<string, [bigint, bigint]>> = {
  int32: [-(2n ** 31n), 2n ** 31n - 1n],
  sint32: [-(2n ** 31n), 2n ** 31n - 1n],
  sfixed32: [-(2n ** 31n), 2n ** 31n - 1n],
  uint32: [0n, 2n ** 32n - 1n],
  fixed32: [0n, 2n ** 32n - 1n],
  int64: [-(2n ** 63n), 2n ** 63n - 1n],
  sint64: [-(2n ** 63n), 2n ** 63n - 1n],
  sfixed64: [-(2n ** 63n), 2n ** 63n - 1n],
  uint64: [0n, 2n ** 64n - 1n],
  fixed64: [0n, 2n ** 64n - 1n],
};

const WRAPPERS: Readonly<Record<string, string>> = {
  'google.protobuf.DoubleValue': 'double',
  'google.protobuf.FloatValue': 'float',
  'google.protobuf.Int64Value': 'int64',
  'google.protobuf.UInt64Value': 'uint64',
  'google.protobuf.Int32Value': 'int32',
  'google.protobuf.UInt32Value': 'uint32',
  'google.protobuf.BoolValue': 'bool',
  'google.protobuf.StringValue': 'string',
  'google.protobuf.BytesValue': 'bytes',
};

/** A proto3 JSON duration ("1.5s") in nanoseconds; undefined when it is not one. */
function durationNanos(value: Json): bigint | undefined {
  if (typeof value !== 'string') return undefined;
  const match = /^(-)?(\d+)(?:\.(\d{1,9}))?s$/.exec(value);
  if (match === null) return undefined;
  const nanos = BigInt(match[2]!) * 1_000_000_000n + BigInt((match[3] ?? '').padEnd(9, '0'));
  return match[1] === undefined ? nanos : -nanos;
}

/**
 * A proto3 JSON duration ("1.5s", as `decode` gives them) in whole milliseconds; throws naming `at`
 * when it is not one.
 */
export function durationMs(value: unknown, at: string): number {
  const nanos = durationNanos(value);
  if (nanos === undefined) throw new Error(`${at}: expected a duration, got ${JSON.stringify(value)}`);
  return Math.round(Number(nanos) / 1e6);
}

/** A PGV duration bound ({seconds, nanos}) in nanoseconds. */
function ruleNanos(bound: unknown): bigint {
  const b = (bound ?? {}) as { seconds?: number | string; nanos?: number };
  return BigInt(b.seconds ?? 0) * 1_000_000_000n + BigInt(b.nanos ?? 0);
}

function compareBounds<T extends number | bigint>(
  value: T,
  rules: Rules,
  toT: (v: unknown) => T,
  say: (v: unknown) => string,
): string | undefined {
  const has = (k: string) => rules[k] !== undefined;
  if (has('const') && value !== toT(rules['const'])) return `must be ${say(rules['const'])}`;
  if (has('lt') && !(value < toT(rules['lt']))) return `must be less than ${say(rules['lt'])}`;
  if (has('lte') && !(value <= toT(rules['lte']))) return `must be at most ${say(rules['lte'])}`;
  if (has('gt') && !(value > toT(rules['gt']))) return `must be more than ${say(rules['gt'])}`;
  if (has('gte') && !(value >= toT(rules['gte']))) return `must be at least ${say(rules['gte'])}`;
  // A list rule with one item (`not_in: 0`) comes as the item itself.
  const listOf = (rule: unknown): unknown[] | undefined =>
    rule === undefined ? undefined : Array.isArray(rule) ? rule : [rule];
  const inList = listOf(rules['in']);
  if (inList !== undefined && inList.length > 0 && !inList.some((v) => toT(v) === value))
    return `must be one of ${inList.map(say).join(', ')}`;
  const notIn = listOf(rules['not_in']);
  if (notIn !== undefined && notIn.some((v) => toT(v) === value)) return `must not be ${say(value)}`;
  return undefined;
}

/** A rule's value in a message. */
const ruleText = (value: unknown): string =>
  typeof value === 'object' && value !== null ? JSON.stringify(value) : String(value);

const HEADER_NAME = /^:?[0-9a-zA-Z!#$%&'*+\-.^_|~`]+$/;

export class EnvoyApi {
  private readonly root = new protobuf.Root();
  private readonly loadedFiles = new Set<string>();

  private constructor(private readonly roots: readonly string[]) {
    this.root.resolvePath = (origin, target) => {
      for (const dir of this.roots) {
        const candidate = join(dir, target);
        if (existsSync(candidate)) return candidate;
      }
      return protobuf.util.path.resolve(origin, target);
    };
  }

  /** Envoy's API, loaded on demand: a type is looked up by loading the file that declares it. */
  static load(): EnvoyApi {
    const api = new EnvoyApi(protoRoots());
    api.lookupType('envoy.config.bootstrap.v3.Bootstrap');
    return api;
  }

  /** Loads the file of package `pkg` that declares the top-level message `name`; false when there is none. */
  private loadDeclaring(pkg: string, name: string): boolean {
    const relative = pkg.split('.').join('/');
    const declaration = new RegExp(`^(message|enum) ${name}\\s*\\{`, 'm');
    for (const dir of this.roots) {
      const folder = join(dir, relative);
      if (!existsSync(folder)) continue;
      for (const file of readdirSync(folder).filter((f) => f.endsWith('.proto'))) {
        const key = join(relative, file);
        if (this.loadedFiles.has(key) || !declaration.test(readFileSync(join(folder, file), 'utf8'))) continue;
        this.root.loadSync(key, { keepCase: true });
        this.root.resolveAll();
        this.loadedFiles.add(key);
        return true;
      }
    }
    return false;
  }

  /** The message type with this full name, loading the file that declares it when needed; undefined when Envoy's API has none. */
  lookupType(fullName: string): protobuf.Type | undefined {
    const find = () => {
      try {
        return this.root.lookupType(fullName);
      } catch {
        return undefined;
      }
    };
    const found = find();
    if (found !== undefined) return found;
    // A nested message (Cluster.LbPolicy) is declared in its outermost message's file: try each split.
    const parts = fullName.split('.');
    for (let cut = parts.length - 1; cut > 0; cut -= 1) {
      if (this.loadDeclaring(parts.slice(0, cut).join('.'), parts[cut]!)) return find();
    }
    return undefined;
  }

  /** Every problem of `value` as a `typeName` message, each "path: problem". */
  check(typeName: string, value: Json, path = ''): string[] {
    const type = this.lookupType(typeName);
    if (type === undefined) return [`${path || '(document)'}: ${typeName} is not a type of Envoy's v3 API`];
    const problems: string[] = [];
    this.checkMessage(type, value, path, problems);
    return problems;
  }

  /**
   * The binary protobuf of a message given in its JSON form (as checked here: durations as "1.5s",
   * typed configs with "@type", wrappers as plain values). Check it first: this throws on what the
   * check would report.
   */
  encode(typeName: string, value: Json): Uint8Array {
    const type = this.lookupType(typeName);
    if (type === undefined) throw new Error(`${typeName} is not a type of Envoy's v3 API`);
    return type.encode(type.fromObject(this.toObject(type, value))).finish();
  }

  /**
   * A message from its binary protobuf, in the JSON form `encode` takes (the inverse of encode):
   * snake_case fields that are set, enums by name, durations as "1.5s", typed configs with "@type",
   * wrappers and structs as plain values.
   */
  decode(typeName: string, bytes: Uint8Array): Json {
    const type = this.lookupType(typeName);
    if (type === undefined) throw new Error(`${typeName} is not a type of Envoy's v3 API`);
    return this.fromMessage(type, type.decode(bytes));
  }

  private fromMessage(type: protobuf.Type, message: protobuf.Message): Json {
    const name = type.fullName.slice(1);
    const fields = message as unknown as Record<string, unknown>;
    if (name === 'google.protobuf.Any') {
      const url = typeof fields['type_url'] === 'string' ? fields['type_url'] : '';
      const inner = this.lookupType(url.slice(TYPE_URL_PREFIX.length));
      if (inner === undefined) throw new Error(`unknown @type ${url}`);
      const content = this.fromMessage(inner, inner.decode(fields['value'] as Uint8Array));
      return this.isSpecialJson(inner.fullName.slice(1))
        ? { '@type': url, value: content }
        : { '@type': url, ...(content as object) };
    }
    if (name === 'google.protobuf.Duration') {
      const nanos =
        BigInt(String((fields['seconds'] as number | string | undefined) ?? 0)) * 1_000_000_000n +
        BigInt(Number(fields['nanos'] ?? 0));
      const whole = nanos / 1_000_000_000n;
      const rest = (nanos < 0n ? -nanos : nanos) % 1_000_000_000n;
      return `${nanos < 0n && whole === 0n ? '-' : ''}${whole}${rest === 0n ? '' : `.${String(rest).padStart(9, '0').replace(/0+$/, '')}`}s`;
    }
    const plain = type.toObject(message, { longs: String, enums: String, bytes: String });
    if (name in WRAPPERS)
      return (
        plain['value'] ??
        (WRAPPERS[name] === 'bool' ? false : WRAPPERS[name] === 'string' || WRAPPERS[name] === 'bytes' ? '' : 0)
      );
    if (name === 'google.protobuf.Struct' || name === 'google.protobuf.Value' || name === 'google.protobuf.ListValue') {
      return plainStruct(name, plain);
    }
    const json: Record<string, Json> = {};
    for (const field of type.fieldsArray) {
      const value = fields[field.name];
      if (value === undefined || value === null || !Object.prototype.hasOwnProperty.call(plain, field.name)) continue;
      // 64-bit integers come back as numbers where they fit one exactly (as they are written), else as strings (proto3 JSON).
      const long = field.type in INT_RANGES && field.type.endsWith('64');
      const one = (item: unknown, plainItem: unknown): Json =>
        field.resolvedType instanceof protobuf.Type
          ? this.fromMessage(field.resolvedType, item as protobuf.Message)
          : long && Number.isSafeInteger(Number(plainItem))
            ? Number(plainItem)
            : plainItem;
      const plainValue: unknown = plain[field.name];
      if (field.map) {
        json[field.name] = Object.fromEntries(
          Object.entries(value as Record<string, unknown>).map(([k, v]) => [
            k,
            one(v, (plainValue as Record<string, unknown>)[k]),
          ]),
        );
      } else if (field.repeated) {
        const items = value as unknown[];
        if (items.length === 0) continue;
        json[field.name] = items.map((item, i) => one(item, (plainValue as unknown[])[i]));
      } else {
        json[field.name] = one(value, plainValue);
      }
    }
    return json;
  }

  /** A message's protobufjs object (what fromObject takes) from its JSON form. */
  private toObject(type: protobuf.Type, value: Json): Record<string, unknown> {
    const name = type.fullName.slice(1);
    if (name === 'google.protobuf.Any') {
      const { '@type': url, ...fields } = value as Record<string, Json>;
      const inner = this.lookupType(String(url).slice(TYPE_URL_PREFIX.length));
      if (inner === undefined) throw new Error(`unknown @type ${String(url)}`);
      const content = this.isSpecialJson(inner.fullName.slice(1)) ? fields['value'] : fields;
      return { type_url: url, value: inner.encode(inner.fromObject(this.toObject(inner, content))).finish() };
    }
    if (name === 'google.protobuf.Duration' || name === 'google.protobuf.Timestamp') {
      const nanos =
        name === 'google.protobuf.Duration' ? durationNanos(value)! : BigInt(Date.parse(String(value))) * 1_000_000n;
      return { seconds: String(nanos / 1_000_000_000n), nanos: Number(nanos % 1_000_000_000n) };
    }
    if (name in WRAPPERS) return { value };
    if (name === 'google.protobuf.Struct')
      return {
        fields: Object.fromEntries(Object.entries(value as Record<string, Json>).map(([k, v]) => [k, structValue(v)])),
      };
    if (name === 'google.protobuf.Value') return structValue(value);
    if (name === 'google.protobuf.ListValue') return { values: (value as Json[]).map(structValue) };
    const byName = new Map<string, protobuf.Field>();
    for (const field of type.fieldsArray) {
      byName.set(field.name, field);
      byName.set(protobuf.util.camelCase(field.name), field);
    }
    const object: Record<string, unknown> = {};
    for (const [key, child] of Object.entries(value as Record<string, Json>)) {
      const field = byName.get(key);
      if (field === undefined) throw new Error(`unknown field ${key} of ${name}`);
      const one = (item: Json) =>
        field.resolvedType instanceof protobuf.Type ? this.toObject(field.resolvedType, item) : item;
      object[field.name] = field.map
        ? Object.fromEntries(Object.entries(child as Record<string, Json>).map(([k, v]) => [k, one(v)]))
        : field.repeated
          ? (child as Json[]).map(one)
          : one(child);
    }
    return object;
  }

  /** A bootstrap: the type check, then every cross-reference. */
  checkBootstrap(bootstrap: Json): string[] {
    const problems = this.check('envoy.config.bootstrap.v3.Bootstrap', bootstrap);
    if (problems.length > 0 || !isObject(bootstrap)) return problems;
    return checkBootstrapReferences(bootstrap);
  }

  private checkMessage(type: protobuf.Type, value: Json, path: string, problems: string[]): void {
    const at = path || '(document)';
    const special = this.checkWellKnown(type.fullName.slice(1), value, at, problems);
    if (special) return;
    if (!isObject(value)) {
      problems.push(`${at}: expected an object (${type.fullName.slice(1)}), got ${JSON.stringify(value)}`);
      return;
    }
    const byName = new Map<string, protobuf.Field>();
    for (const field of type.fieldsArray) {
      byName.set(field.name, field);
      byName.set(protobuf.util.camelCase(field.name), field);
    }
    const present = new Set<protobuf.Field>();
    for (const [key, child] of Object.entries(value)) {
      const field = byName.get(key);
      const childPath = path === '' ? key : `${path}.${key}`;
      if (field === undefined) {
        problems.push(`${childPath}: unknown field of ${type.fullName.slice(1)}`);
        continue;
      }
      if (present.has(field)) problems.push(`${childPath}: ${field.name} is set twice (by both of its names)`);
      present.add(field);
      if (field.options?.['deprecated'] === true)
        problems.push(`${childPath}: deprecated in Envoy's API (${type.fullName.slice(1)}.${field.name})`);
      this.checkField(field, child, childPath, problems);
    }
    for (const oneof of type.oneofsArray) {
      const set = oneof.fieldsArray.filter((f) => present.has(f));
      if (set.length > 1)
        problems.push(`${at}: only one of ${set.map((f) => f.name).join(', ')} may be set (oneof ${oneof.name})`);
      const required =
        oneof.options?.['(validate.required)'] === true || parsedOption(oneof, '(validate.required)') !== undefined;
      if (required && set.length === 0)
        problems.push(`${at}: one of ${oneof.fieldsArray.map((f) => f.name).join(', ')} is required`);
    }
    // Absent fields hold their default, which PGV checks too (a missing string with min_len 1 fails).
    for (const field of type.fieldsArray) {
      if (present.has(field) || field.partOf !== null) continue;
      const rules = parsedOption(field, '(validate.rules)');
      if (rules === undefined) continue;
      const childPath = path === '' ? field.name : `${path}.${field.name}`;
      if ((rules['message'] as Rules | undefined)?.['required'] === true) problems.push(`${childPath}: required`);
      if (field.repeated || field.map) {
        const minItems =
          (rules['repeated'] as Rules | undefined)?.['min_items'] ?? (rules['map'] as Rules | undefined)?.['min_pairs'];
        if (minItems !== undefined && Number(minItems) > 0)
          problems.push(`${childPath}: required (at least ${ruleText(minItems)})`);
      } else if (field.resolvedType === null) {
        const scalar = this.defaultScalar(field.type);
        if (scalar !== undefined) this.checkScalarRules(field.type, scalar, rules, childPath, problems, true);
      }
    }
  }

  private defaultScalar(type: string): Json {
    if (type === 'string' || type === 'bytes') return '';
    if (type === 'bool') return false;
    if (type in INT_RANGES || type === 'double' || type === 'float') return 0;
    return undefined;
  }

  private checkField(field: protobuf.Field, value: Json, path: string, problems: string[]): void {
    const rules = parsedOption(field, '(validate.rules)') ?? {};
    if (field.map) {
      if (!isObject(value)) {
        problems.push(`${path}: expected an object (a map), got ${JSON.stringify(value)}`);
        return;
      }
      const mapRules = (rules['map'] ?? {}) as Rules;
      const pairs = Object.keys(value).length;
      if (mapRules['min_pairs'] !== undefined && pairs < Number(mapRules['min_pairs']))
        problems.push(`${path}: at least ${ruleText(mapRules['min_pairs'])} entries`);
      if (mapRules['max_pairs'] !== undefined && pairs > Number(mapRules['max_pairs']))
        problems.push(`${path}: at most ${ruleText(mapRules['max_pairs'])} entries`);
      for (const [key, item] of Object.entries(value)) {
        const keyType = (field as unknown as protobuf.MapField).keyType;
        if (mapRules['keys'] !== undefined)
          this.checkScalarRules(keyType, key, mapRules['keys'] as Rules, `${path}.${key}`, problems, false);
        this.checkSingle(field, item, `${path}.${key}`, (mapRules['values'] ?? {}) as Rules, problems);
      }
      return;
    }
    if (field.repeated) {
      if (!Array.isArray(value)) {
        problems.push(`${path}: expected a list, got ${JSON.stringify(value)}`);
        return;
      }
      const listRules = (rules['repeated'] ?? {}) as Rules;
      if (listRules['min_items'] !== undefined && value.length < Number(listRules['min_items']))
        problems.push(`${path}: at least ${ruleText(listRules['min_items'])} items`);
      if (listRules['max_items'] !== undefined && value.length > Number(listRules['max_items']))
        problems.push(`${path}: at most ${ruleText(listRules['max_items'])} items`);
      if (listRules['unique'] === true && new Set(value.map((v) => JSON.stringify(v))).size !== value.length)
        problems.push(`${path}: items must be unique`);
      value.forEach((item, i) =>
        this.checkSingle(field, item, `${path}[${i}]`, (listRules['items'] ?? {}) as Rules, problems),
      );
      return;
    }
    this.checkSingle(field, value, path, rules, problems);
  }

  /** One value of a field (a list item, a map value, or the field itself) against its type and rules. */
  private checkSingle(field: protobuf.Field, value: Json, path: string, rules: Rules, problems: string[]): void {
    const resolved = field.resolvedType;
    if (resolved instanceof protobuf.Enum) {
      this.checkEnum(resolved, value, path, rules, problems);
      return;
    }
    if (resolved instanceof protobuf.Type) {
      const name = resolved.fullName.slice(1);
      if (value === null) {
        if ((rules['message'] as Rules | undefined)?.['required'] === true) problems.push(`${path}: required`);
        return;
      }
      this.checkMessage(resolved, value, path, problems);
      const wrapped = WRAPPERS[name];
      if (wrapped !== undefined && rules[wrapped] !== undefined)
        this.checkScalarRules(wrapped, value, rules, path, problems, false);
      if (name === 'google.protobuf.Duration' && rules['duration'] !== undefined) {
        const nanos = durationNanos(value);
        if (nanos !== undefined) {
          const problem = compareBounds(
            nanos,
            rules['duration'] as Rules,
            ruleNanos,
            (b) => `${Number(ruleNanos(b)) / 1e9}s`,
          );
          if (problem !== undefined) problems.push(`${path}: ${problem}`);
        }
      }
      if (name === 'google.protobuf.Any' && rules['any'] !== undefined && isObject(value)) {
        const allowedRule = (rules['any'] as Rules)['in'] as string[] | string | undefined;
        const allowed = typeof allowedRule === 'string' ? [allowedRule] : allowedRule;
        if (allowed !== undefined && allowed.length > 0 && !allowed.includes(String(value['@type']))) {
          problems.push(`${path}.@type: must be one of ${allowed.join(', ')}`);
        }
      }
      return;
    }
    this.checkScalarRules(field.type, value, rules, path, problems, false);
  }

  private checkEnum(type: protobuf.Enum, value: Json, path: string, rules: Rules, problems: string[]): void {
    let number: number | undefined;
    if (typeof value === 'string') {
      number = type.values[value];
      if (number === undefined) {
        problems.push(
          `${path}: ${JSON.stringify(value)} is not a value of ${type.fullName.slice(1)} (${Object.keys(type.values).join(', ')})`,
        );
        return;
      }
      const valueOptions = (type as unknown as { valuesOptions?: Record<string, Record<string, unknown>> })
        .valuesOptions?.[value];
      if (valueOptions?.['deprecated'] === true) problems.push(`${path}: ${value} is deprecated in Envoy's API`);
    } else if (typeof value === 'number' && Number.isInteger(value)) {
      number = value;
      if (!Object.values(type.values).includes(value))
        problems.push(`${path}: ${value} is not a value of ${type.fullName.slice(1)}`);
    } else {
      problems.push(`${path}: expected a value of ${type.fullName.slice(1)}, got ${JSON.stringify(value)}`);
      return;
    }
    const enumRules = rules['enum'] as Rules | undefined;
    if (enumRules !== undefined && number !== undefined) {
      const problem = compareBounds(number, enumRules, Number, String);
      if (problem !== undefined) problems.push(`${path}: ${problem}`);
    }
  }

  private checkScalarRules(
    type: string,
    value: Json,
    allRules: Rules,
    path: string,
    problems: string[],
    isDefault: boolean,
  ): void {
    const rules = (allRules[type] ?? (type === 'sfixed32' || type === 'sfixed64' ? undefined : undefined)) as
      Rules | undefined;
    if (!isDefault && !this.scalarTypeOk(type, value, path, problems)) return;
    if (rules === undefined) return;
    if (isDefault && rules['ignore_empty'] === true) return;
    if (rules['ignore_empty'] === true && (value === '' || value === 0 || value === '0')) return;
    if (type === 'string') {
      const text = String(value);
      const length = [...text].length;
      const bytes = Buffer.byteLength(text);
      const fail = (why: string) => problems.push(`${path}: ${why}${isDefault ? ' (the field is missing)' : ''}`);
      if (rules['min_len'] !== undefined && length < Number(rules['min_len']))
        return void fail(`must be at least ${ruleText(rules['min_len'])} characters`);
      if (rules['max_len'] !== undefined && length > Number(rules['max_len']))
        return void fail(`must be at most ${ruleText(rules['max_len'])} characters`);
      if (rules['min_bytes'] !== undefined && bytes < Number(rules['min_bytes']))
        return void fail(`must be at least ${ruleText(rules['min_bytes'])} bytes`);
      if (rules['max_bytes'] !== undefined && bytes > Number(rules['max_bytes']))
        return void fail(`must be at most ${ruleText(rules['max_bytes'])} bytes`);
      if (rules['prefix'] !== undefined && !text.startsWith(ruleText(rules['prefix'])))
        return void fail(`must start with ${ruleText(rules['prefix'])}`);
      if (rules['suffix'] !== undefined && !text.endsWith(ruleText(rules['suffix'])))
        return void fail(`must end with ${ruleText(rules['suffix'])}`);
      if (rules['contains'] !== undefined && !text.includes(ruleText(rules['contains'])))
        return void fail(`must contain ${ruleText(rules['contains'])}`);
      const inRule = rules['in'] as string[] | string | undefined;
      const inList = typeof inRule === 'string' ? [inRule] : inRule;
      if (inList !== undefined && inList.length > 0 && !inList.includes(text))
        return void fail(`must be one of ${inList.join(', ')}`);
      const strict = rules['strict'] !== false;
      if (rules['well_known_regex'] === 'HTTP_HEADER_NAME' && text !== '' && strict && !HEADER_NAME.test(text))
        return void fail('is not a valid HTTP header name');
      if (rules['well_known_regex'] === 'HTTP_HEADER_VALUE' && strict && /[\0\r\n]/.test(text))
        return void fail('is not a valid HTTP header value');
      return;
    }
    if (type in INT_RANGES) {
      const problem = compareBounds(
        BigInt(value as number | string),
        rules,
        (v) => BigInt(v as number | string),
        String,
      );
      if (problem !== undefined) problems.push(`${path}: ${problem}${isDefault ? ' (the field is missing)' : ''}`);
      return;
    }
    if (type === 'double' || type === 'float') {
      const problem = compareBounds(Number(value), rules, Number, String);
      if (problem !== undefined) problems.push(`${path}: ${problem}${isDefault ? ' (the field is missing)' : ''}`);
    }
  }

  private scalarTypeOk(type: string, value: Json, path: string, problems: string[]): boolean {
    const fail = (expected: string) => {
      problems.push(`${path}: expected ${expected}, got ${JSON.stringify(value)}`);
      return false;
    };
    switch (type) {
      case 'string':
        return typeof value === 'string' || fail('a string');
      case 'bool':
        return typeof value === 'boolean' || fail('true or false');
      case 'bytes':
        return (typeof value === 'string' && /^[A-Za-z0-9+/_-]*={0,2}$/.test(value)) || fail('base64 bytes');
      case 'double':
      case 'float':
        return (
          (typeof value === 'number' && Number.isFinite(value)) ||
          ['NaN', 'Infinity', '-Infinity'].includes(String(value)) ||
          fail('a number')
        );
      default: {
        const range = INT_RANGES[type];
        if (range === undefined) return true;
        const text =
          typeof value === 'number' && Number.isInteger(value)
            ? String(value)
            : typeof value === 'string' && /^-?\d+$/.test(value)
              ? value
              : undefined;
        if (text === undefined) return fail(`an integer (${type})`);
        const n = BigInt(text);
        return (n >= range[0] && n <= range[1]) || fail(`an integer in the range of ${type}`);
      }
    }
  }

  /** Types whose JSON form is not an object of fields; true when `name` is one (and it was checked). */
  private checkWellKnown(name: string, value: Json, at: string, problems: string[]): boolean {
    switch (name) {
      case 'google.protobuf.Duration':
        if (durationNanos(value) === undefined)
          problems.push(`${at}: expected a duration such as "1.5s", got ${JSON.stringify(value)}`);
        return true;
      case 'google.protobuf.Timestamp':
        if (typeof value !== 'string' || Number.isNaN(Date.parse(value)))
          problems.push(`${at}: expected an RFC 3339 time, got ${JSON.stringify(value)}`);
        return true;
      case 'google.protobuf.FieldMask':
        if (typeof value !== 'string')
          problems.push(`${at}: expected a field mask string, got ${JSON.stringify(value)}`);
        return true;
      case 'google.protobuf.Struct':
        if (!isObject(value)) problems.push(`${at}: expected an object, got ${JSON.stringify(value)}`);
        return true;
      case 'google.protobuf.Value':
        return true;
      case 'google.protobuf.ListValue':
        if (!Array.isArray(value)) problems.push(`${at}: expected a list, got ${JSON.stringify(value)}`);
        return true;
      case 'google.protobuf.Empty':
        if (!isObject(value) || Object.keys(value).length > 0)
          problems.push(`${at}: expected {}, got ${JSON.stringify(value)}`);
        return true;
      case 'google.protobuf.Any':
        this.checkAny(value, at, problems);
        return true;
      default: {
        const wrapped = WRAPPERS[name];
        if (wrapped === undefined) return false;
        this.scalarTypeOk(wrapped, value, at, problems);
        return true;
      }
    }
  }

  private checkAny(value: Json, at: string, problems: string[]): void {
    if (!isObject(value)) {
      problems.push(`${at}: expected a typed config object with "@type", got ${JSON.stringify(value)}`);
      return;
    }
    const url = value['@type'];
    if (typeof url !== 'string' || !url.startsWith(TYPE_URL_PREFIX)) {
      problems.push(`${at}.@type: expected "${TYPE_URL_PREFIX}<message>", got ${JSON.stringify(url)}`);
      return;
    }
    const typeName = url.slice(TYPE_URL_PREFIX.length);
    const type = this.lookupType(typeName);
    if (type === undefined) {
      problems.push(`${at}.@type: ${typeName} is not a message of Envoy's v3 API`);
      return;
    }
    const { '@type': _type, ...fields } = value;
    const path = at === '(document)' ? '' : at;
    if (this.isSpecialJson(typeName)) this.checkMessage(type, fields['value'], `${path}.value`, problems);
    else this.checkMessage(type, fields, path, problems);
  }

  private isSpecialJson(name: string): boolean {
    return (
      name in WRAPPERS ||
      [
        'google.protobuf.Duration',
        'google.protobuf.Timestamp',
        'google.protobuf.Struct',
        'google.protobuf.Value',
        'google.protobuf.ListValue',
        'google.protobuf.FieldMask',
      ].includes(name)
    );
  }
}

/** A decoded google.protobuf.Struct, Value or ListValue (protobufjs's plain object, camelCase) as plain JSON. */
function plainStruct(name: string, plain: Record<string, unknown>): Json {
  if (name === 'google.protobuf.Struct') {
    return Object.fromEntries(
      Object.entries((plain['fields'] ?? {}) as Record<string, Record<string, unknown>>).map(([k, v]) => [
        k,
        plainStruct('google.protobuf.Value', v),
      ]),
    );
  }
  if (name === 'google.protobuf.ListValue')
    return ((plain['values'] ?? []) as Record<string, unknown>[]).map((v) => plainStruct('google.protobuf.Value', v));
  if ('structValue' in plain)
    return plainStruct('google.protobuf.Struct', plain['structValue'] as Record<string, unknown>);
  if ('listValue' in plain)
    return plainStruct('google.protobuf.ListValue', plain['listValue'] as Record<string, unknown>);
  if ('numberValue' in plain) return plain['numberValue'];
  if ('stringValue' in plain) return plain['stringValue'];
  if ('boolValue' in plain) return plain['boolValue'];
  return null;
}

/**
 * A google.protobuf.Value's protobufjs object from plain JSON. protobufjs defines the well-known
 * struct types itself, with camelCase field names (whatever keepCase says for Envoy's files).
 */
function structValue(value: Json): Record<string, unknown> {
  if (value === null) return { nullValue: 0 };
  if (typeof value === 'number') return { numberValue: value };
  if (typeof value === 'string') return { stringValue: value };
  if (typeof value === 'boolean') return { boolValue: value };
  if (Array.isArray(value)) return { listValue: { values: value.map(structValue) } };
  return {
    structValue: {
      fields: Object.fromEntries(Object.entries(value as Record<string, Json>).map(([k, v]) => [k, structValue(v)])),
    },
  };
}

/** Walks a JSON document, calling `visit` with each object and its path. */
function walk(value: Json, path: string, visit: (object: Record<string, Json>, path: string) => void): void {
  if (Array.isArray(value)) value.forEach((item, i) => walk(item, `${path}[${i}]`, visit));
  else if (isObject(value)) {
    visit(value, path);
    for (const [key, child] of Object.entries(value)) walk(child, path === '' ? key : `${path}.${key}`, visit);
  }
}

/** Cross-references of a bootstrap that passed the type check. */
export function checkBootstrapReferences(bootstrap: Record<string, Json>): string[] {
  const problems: string[] = [];
  const resources = (bootstrap['static_resources'] ?? bootstrap['staticResources'] ?? {}) as Record<string, Json>;
  const clusters = (resources['clusters'] ?? []) as Record<string, Json>[];
  const listeners = (resources['listeners'] ?? []) as Record<string, Json>[];
  const clusterNames = new Map<string, number>();
  clusters.forEach((cluster, i) => {
    const name = String(cluster['name']);
    if (clusterNames.has(name))
      problems.push(
        `static_resources.clusters[${i}].name: "${name}" is also the name of clusters[${clusterNames.get(name)}]`,
      );
    clusterNames.set(name, i);
    const assignment = cluster['load_assignment'] as Record<string, Json> | undefined;
    if (assignment !== undefined && assignment['cluster_name'] !== name) {
      problems.push(
        `static_resources.clusters[${i}].load_assignment.cluster_name: "${String(assignment['cluster_name'])}" is not the cluster's name "${name}"`,
      );
    }
  });
  const listenerNames = new Map<string, number>();
  const listenerPorts = new Map<string, number>();
  listeners.forEach((listener, i) => {
    const name = String(listener['name']);
    if (listenerNames.has(name))
      problems.push(
        `static_resources.listeners[${i}].name: "${name}" is also the name of listeners[${listenerNames.get(name)}]`,
      );
    listenerNames.set(name, i);
    const socket = ((listener['address'] as Record<string, Json> | undefined)?.['socket_address'] ?? {}) as Record<
      string,
      Json
    >;
    const port = String(socket['port_value']);
    if (listenerPorts.has(port))
      problems.push(
        `static_resources.listeners[${i}].address: port ${port} is also the port of listeners[${listenerPorts.get(port)}]`,
      );
    listenerPorts.set(port, i);
  });
  const admin = (bootstrap['admin'] as Record<string, Json> | undefined)?.['address'] as
    Record<string, Json> | undefined;
  const adminHost = (admin?.['socket_address'] as Record<string, Json> | undefined)?.['address'];
  if (admin !== undefined && adminHost !== '127.0.0.1' && adminHost !== '::1' && adminHost !== 'localhost') {
    problems.push(
      `admin.address.socket_address.address: the admin API must listen on localhost only, not ${String(adminHost)}`,
    );
  }
  // Every cluster named anywhere: routes, weighted clusters, mirrors, gRPC services (ADS, tracing).
  const references: [string, string][] = [];
  walk(bootstrap, '', (object, path) => {
    if (path.includes('.route') || path.includes('route.')) {
      if (typeof object['cluster'] === 'string') references.push([`${path}.cluster`, object['cluster']]);
    }
    const weighted = object['weighted_clusters'] as Record<string, Json> | undefined;
    ((weighted?.['clusters'] ?? []) as Record<string, Json>[]).forEach((c, i) =>
      references.push([`${path}.weighted_clusters.clusters[${i}].name`, String(c['name'])]),
    );
    const envoyGrpc = object['envoy_grpc'] as Record<string, Json> | undefined;
    if (envoyGrpc !== undefined)
      references.push([`${path}.envoy_grpc.cluster_name`, String(envoyGrpc['cluster_name'])]);
  });
  for (const [path, name] of references) {
    if (!clusterNames.has(name))
      problems.push(
        `${path}: no cluster "${name}" is defined (static_resources.clusters has ${[...clusterNames.keys()].join(', ') || 'none'})`,
      );
  }
  return problems;
}
