import { status } from '@grpc/grpc-js';
import { RpcError } from '@infermesh/grpc';
import {
  checkModelId,
  checkVersionId,
  isModelId,
  isVersionId,
  modelIdOf,
  modelName,
  modelNameOf,
  splitModelName,
  splitVersionName,
  versionIdOf,
  versionName,
} from './resource-names';

describe('resource names', () => {
  it('builds and takes apart models/{model} and models/{model}/versions/{version}', () => {
    expect(modelName('mlp')).toBe('models/mlp');
    expect(versionName('mlp', '3')).toBe('models/mlp/versions/3');
    expect(splitModelName('models/mlp')).toBe('mlp');
    expect(splitVersionName('models/mlp/versions/3')).toEqual({ modelId: 'mlp', versionId: '3' });
    expect(modelIdOf('models/mlp')).toBe('mlp');
    expect(modelNameOf('models/mlp/versions/3')).toBe('models/mlp');
    expect(versionIdOf('models/mlp/versions/3')).toBe('3');
  });

  it.each(['mlp/versions/3', 'models/mlp/x', 'models/a/b/versions/3', 'models//versions/3'])(
    'says %s is not a version name',
    (name) => {
      expect(splitVersionName(name)).toBeUndefined();
    },
  );

  it.each(['mlp', 'models/a/b', 'models/', 'models/mlp/versions/3'])('says %s is not a model name', (name) => {
    expect(splitModelName(name)).toBeUndefined();
  });

  it('accepts the registry ids and refuses the others with INVALID_ARGUMENT naming them', () => {
    expect(['mlp', 'A.b_c-1', 'x'.repeat(64)].map(isModelId)).toEqual([true, true, true]);
    expect(['', '-mlp', 'x'.repeat(65), 'a/b', 'a b'].map(isModelId)).toEqual([false, false, false, false, false]);
    expect(['1', '42', '9'.repeat(15)].map(isVersionId)).toEqual([true, true, true]);
    expect(['', '0', '01', 'v1', '1.5', '9'.repeat(16)].map(isVersionId)).toEqual([
      false,
      false,
      false,
      false,
      false,
      false,
    ]);
    expect(checkModelId('mlp')).toBe('mlp');
    expect(checkVersionId('7')).toBe('7');

    expect(() => checkModelId('a/b')).toThrow(
      new RpcError(
        status.INVALID_ARGUMENT,
        'invalid model name "a/b": expected a letter or digit followed by up to 63 letters, digits, "_", "." or "-"',
      ),
    );
    expect(() => checkVersionId('v1')).toThrow('invalid version id "v1": expected a positive integer such as "1"');
  });
});
