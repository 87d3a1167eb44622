/**
 * A live view of a cluster as a JupyterLab main-area tab: an iframe on the server
 * extension's page (`{base_url}clamor/dashboard/{kernel_id}[/VIEW]`), which keeps
 * itself live (it polls the server for patches to its Bokeh document).
 */

import { IFrame, MainAreaWidget } from '@jupyterlab/apputils';
import { LabIcon, ToolbarButton, launchIcon, refreshIcon } from '@jupyterlab/ui-components';

import { VIEWS, viewUrl } from './api';

export class ClamorView extends MainAreaWidget<IFrame> {
  constructor(
    readonly kernelId: string,
    readonly view: string,
    readonly name: string,
    icon: LabIcon
  ) {
    // the page runs BokehJS and polls its own server with the login cookie: scripts and
    // same origin (the origin is this Jupyter server, which serves Lab itself)
    super({ content: new IFrame({ sandbox: ['allow-scripts', 'allow-same-origin'] }) });
    const label = VIEWS.find(v => v.name === view)?.label ?? view;
    this.id = ClamorView.widgetId(kernelId, view);
    this.addClass('clamor-View');
    this.node.dataset.kernelId = kernelId;
    this.node.dataset.view = view;
    this.title.label = `Clamor ${label} · ${name}`;
    this.title.caption = `Clamor ${label} of the cluster of kernel ${kernelId}`;
    this.title.icon = icon;
    this.title.closable = true;
    this.url = viewUrl(kernelId, view);
    this.content.url = this.url;
    this.toolbar.addItem(
      'reload',
      new ToolbarButton({
        icon: refreshIcon,
        tooltip: 'Reload the view',
        onClick: () => {
          this.content.url = '';
          requestAnimationFrame(() => (this.content.url = this.url));
        }
      })
    );
    this.toolbar.addItem(
      'open',
      new ToolbarButton({
        icon: launchIcon,
        tooltip: 'Open the view in a browser tab',
        onClick: () => window.open(this.url, '_blank', 'noopener')
      })
    );
  }

  /** The page the iframe shows. */
  readonly url: string;

  /** One tab per view of a cluster: opening it again activates it. */
  static widgetId(kernelId: string, view: string): string {
    return `clamor-view-${kernelId}-${view}`;
  }
}
