"""gcp-storage-emulator as the GCS tests run it: `python gcs_emulator.py HOST PORT BUCKET`, with
two answers made as real GCS gives them:
- its object downloads lack the x-goog-generation header real GCS sends with every object's bytes,
  which TensorStore's gcs kvstore needs (it refuses the answer without one: "Malformed
  StorageGeneration"): added from the object's own record;
- asked how much of a resumable upload it holds before it holds anything, it answers
  "Range: bytes=0-0" (one byte); GCS sends no Range then."""
import sys

from gcp_storage_emulator import server
from gcp_storage_emulator.handlers import objects

_download = objects.download


def download(request, response, storage, *args, **kwargs):
    try:
        record = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
        response["x-goog-generation"] = str(record["generation"])
        response["x-goog-metageneration"] = str(record.get("metageneration", "1"))
    except Exception:  # noqa: BLE001 - a missing object is the emulator's own 404 to give
        pass
    return _download(request, response, storage, *args, **kwargs)


_incomplete = objects._resumable_incomplete


def resumable_incomplete(response, storage, upload_id, fallback_end=0):
    _incomplete(response, storage, upload_id, fallback_end)
    if storage.get_resumable_byte_count(upload_id) == 0 and fallback_end == 0:
        del response._headers["Range"]


objects.download = download  # objects.get calls it by this name for ?alt=media
objects._resumable_incomplete = resumable_incomplete
server.HANDLERS = tuple((regex, {m: download if h is _download else h for m, h in handlers.items()})
                        for regex, handlers in server.HANDLERS)

if __name__ == "__main__":
    host, port, bucket = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    server.create_server(host, port, in_memory=True, default_bucket=bucket).run()
