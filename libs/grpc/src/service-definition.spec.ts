import { create } from '@bufbuild/protobuf';
import {
  GetModelResponseSchema,
  RegistryService,
  VersionState,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { toServiceDefinition } from './service-definition';

describe('toServiceDefinition', () => {
  const sut = toServiceDefinition(RegistryService);

  it('keys each method by its local name with its fully qualified path', () => {
    expect(Object.keys(sut).sort()).toEqual([
      'createModelVersion',
      'deleteModel',
      'downloadArtifact',
      'getModel',
      'listModels',
      'quantizeModelVersion',
      'reportTraffic',
      'reportVersionState',
      'resolveModelVersion',
      'retireModelVersion',
      'setCachePolicy',
      'setRolloutPolicy',
      'startAutoRollout',
      'updateModel',
      'updateRollout',
      'uploadArtifact',
      'watchModels',
    ]);
    expect(sut['getModel']?.path).toBe('/infermesh.registry.v1.RegistryService/GetModel');
    expect(sut['uploadArtifact']?.path).toBe('/infermesh.registry.v1.RegistryService/UploadArtifact');
  });

  it('marks client-streaming and server-streaming methods', () => {
    expect(sut['getModel']).toMatchObject({ requestStream: false, responseStream: false });
    expect(sut['uploadArtifact']).toMatchObject({ requestStream: true, responseStream: false });
    expect(sut['downloadArtifact']).toMatchObject({ requestStream: false, responseStream: true });
  });

  it('serializes to protobuf binary and back, from a plain init object', () => {
    const method = sut['getModel']!;
    const init = {
      model: { name: 'models/mlp', versions: [{ name: 'models/mlp/versions/1', state: VersionState.READY }] },
    };

    const bytes = method.responseSerialize(init);
    const decoded = method.responseDeserialize(bytes);

    expect(Buffer.isBuffer(bytes)).toBe(true);
    expect(decoded).toEqual(create(GetModelResponseSchema, init));
  });

  it('encodes an empty message as zero bytes', () => {
    expect(sut['listModels']!.requestSerialize({}).length).toBe(0);
  });
});
