/**
 * The jupyter-server extension's REST API (extension/handlers.py, extension/api.py),
 * as the sidebar reads it. Every URL is built from the page's base URL
 * (`PageConfig.getBaseUrl()`), so it works under any `base_url`, JupyterHub's
 * `/user/NAME/` included; requests go through `ServerConnection`, which adds the
 * token or XSRF header the server expects.
 */

import { PageConfig, URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** The live views the server extension serves (extension/pages.py `VIEWS`), in order. */
export const VIEWS: ReadonlyArray<{ name: string; label: string }> = [
  { name: 'dashboard', label: 'Dashboard' },
  { name: 'heatmap', label: 'Heatmap' },
  { name: 'replication', label: 'Replication' },
  { name: 'timeline', label: 'Timeline' },
  { name: 'lineage', label: 'Lineage' }
];

/** A row of `clamor/api/clusters`: a running kernel's cluster. */
export interface IClusterRow {
  kernel_id: string;
  kernel_name: string | null;
  execution_state: string | null;
  pid: number;
  address: string;
  workers: number;
  created: number;
}

/** A stage in progress: its tasks by state. */
export interface IStageCounts {
  total: number;
  pending: number;
  running: number;
  done: number;
  speculative: number;
}

/** `clamor/api/clusters/{id}`: what the cluster did so far. */
export interface IClusterSummary {
  running: boolean;
  workers: number;
  workers_lost: number;
  stages_run: number;
  tasks_run: number;
  bytes_served_by_driver: number;
  bytes_served_by_peers: number;
  bytes_mapped: number;
  pages_fetched: number;
  pages_mapped: number;
  faults: number;
  worker_rss_bytes: number;
  active_stages: { [stage: string]: IStageCounts };
}

/** A worker of `clamor/api/clusters/{id}/workers` (the fields the sidebar shows). */
export interface IWorker {
  id: number;
  alive: boolean;
  running: number;
  tasks_done: number;
  slow: boolean;
  host?: string;
  memory_budget: number;
  partition_bytes: number;
  disk_bytes: number;
  cached_bytes: number;
  rss_bytes?: number;
  error?: string;
}

/** A cluster and, when it answered, its summary and workers (else `error`). */
export interface ICluster {
  row: IClusterRow;
  summary: IClusterSummary | null;
  workers: IWorker[];
  error: string | null;
}

/** `{base_url}clamor/...` as an absolute URL of this page's server. */
export function clamorUrl(...parts: string[]): string {
  return URLExt.join(PageConfig.getBaseUrl(), 'clamor', ...parts.map(encodeURIComponent));
}

/** The page of view `view` of the cluster of kernel `kernelId`. */
export function viewUrl(kernelId: string, view: string): string {
  return view === 'dashboard'
    ? clamorUrl('dashboard', kernelId)
    : clamorUrl('dashboard', kernelId, view);
}

/** An error with the server's message (the API answers JSON errors: `{"message": ...}`). */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string
  ) {
    super(message);
  }
}

async function getJSON<T>(url: string, settings: ServerConnection.ISettings): Promise<T> {
  const response = await ServerConnection.makeRequest(url, { cache: 'no-store' }, settings);
  let body: any = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  if (!response.ok) {
    const message = (body && body.message) || `HTTP ${response.status} ${response.statusText}`;
    throw new ApiError(response.status, message);
  }
  return body as T;
}

/** Every cluster of this server's running kernels, with its summary and workers. */
export async function fetchClusters(settings: ServerConnection.ISettings): Promise<ICluster[]> {
  const listing = await getJSON<{ clusters: IClusterRow[] }>(clamorUrl('api', 'clusters'), settings);
  return Promise.all(
    listing.clusters.map(async row => {
      try {
        const [summary, workers] = await Promise.all([
          getJSON<IClusterSummary>(clamorUrl('api', 'clusters', row.kernel_id), settings),
          getJSON<{ workers: IWorker[] }>(
            clamorUrl('api', 'clusters', row.kernel_id, 'workers'),
            settings
          )
        ]);
        return { row, summary, workers: workers.workers, error: null };
      } catch (err) {
        return { row, summary: null, workers: [], error: String((err as Error).message || err) };
      }
    })
  );
}
