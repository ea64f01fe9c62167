import { execFile } from 'node:child_process';
import { parseAllDocuments } from 'yaml';
import type { K8sObject } from './manifest-checks';

/** Why a kustomization could not be rendered (kubectl missing, or kustomize refused it). */
export class RenderError extends Error {}

/** Renders a kustomization with `kubectl kustomize` (kustomize as kubectl ships it) into its objects. */
export function renderKustomization(dir: string, kubectl = process.env['KUBECTL'] ?? 'kubectl'): Promise<K8sObject[]> {
  return new Promise((resolve, reject) => {
    execFile(kubectl, ['kustomize', dir], { maxBuffer: 64 * 1024 * 1024 }, (error, stdout, stderr) => {
      if (error !== null) {
        const missing = (error as NodeJS.ErrnoException).code === 'ENOENT';
        reject(new RenderError(missing ? `${kubectl} not found: the Kubernetes checks need kubectl with kustomize (apt-get install kubectl, or set KUBECTL)` : `kubectl kustomize ${dir} failed: ${stderr.trim() || error.message}`));
        return;
      }
      try {
        resolve(parseManifest(stdout, dir));
      } catch (parseError) {
        reject(parseError instanceof Error ? parseError : new Error(String(parseError)));
      }
    });
  });
}

/** The objects of a multi-document YAML manifest. */
export function parseManifest(text: string, source: string): K8sObject[] {
  const objects: K8sObject[] = [];
  for (const document of parseAllDocuments(text)) {
    if (document.errors.length > 0) throw new RenderError(`${source}: ${document.errors[0]!.message}`);
    const value = document.toJS() as K8sObject | null;
    if (value === null) continue;
    if (typeof value.kind !== 'string' || typeof value.apiVersion !== 'string' || typeof value.metadata?.name !== 'string') {
      throw new RenderError(`${source}: an object without apiVersion, kind and metadata.name`);
    }
    objects.push(value);
  }
  return objects;
}
