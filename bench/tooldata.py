"""The judged tool set of issue 16: 500 tool descriptions and paraphrased requests for some of them.

``python bench/tooldata.py`` writes ``bench/data/tools.jsonl`` (one registrable tool per line) and
checks ``bench/data/tool_queries.json`` (each query names the one tool that answers it) against it.
The tools are 50 services of the kind an agent's MCP hosts offer, each with six CRUD-style tools (so
most of the catalogue is near-duplicates across services, as real registries are) and four
service-specific ones. Descriptions read like tool authors write them; the queries are a user's words
for what they want done, written without copying the description's wording (bench/tools.py reports
recall@5 over them; tests/test_registry.py checks one).
"""
from __future__ import annotations

import json
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"

# key, display name, object (singular, plural), where objects live, tags, four specific tools:
# (operation, description, {property: description})
SERVICES = [
    ("github", "GitHub", ("issue", "issues"), "repository", ["code", "vcs"], [
        ("merge_pull_request", "Merge an open pull request into its base branch using merge, squash or rebase.",
         {"repo": "owner/name", "number": "Pull request number", "method": "merge, squash or rebase"}),
        ("create_branch", "Create a new git branch from an existing branch or commit SHA.",
         {"repo": "owner/name", "branch": "New branch name", "from_ref": "Source branch or SHA"}),
        ("list_workflow_runs", "List recent GitHub Actions workflow runs with their status and conclusion.",
         {"repo": "owner/name", "status": "queued, in_progress or completed"}),
        ("request_review", "Request reviewers for a pull request.",
         {"repo": "owner/name", "number": "Pull request number", "reviewers": "GitHub logins"})]),
    ("gitlab", "GitLab", ("merge request", "merge requests"), "project", ["code", "vcs"], [
        ("retry_pipeline", "Retry the failed jobs of a CI/CD pipeline.", {"project": "Project path", "pipeline_id": "Pipeline id"}),
        ("protect_branch", "Protect a branch so only maintainers can push or merge.", {"project": "Project path", "branch": "Branch"}),
        ("compare_refs", "Compare two branches, tags or commits and return the diff.", {"project": "Project path", "from": "Base ref", "to": "Head ref"}),
        ("list_tags", "List the release tags of a project.", {"project": "Project path"})]),
    ("jira", "Jira", ("ticket", "tickets"), "project", ["tracker"], [
        ("transition_issue", "Move a Jira issue to another workflow status such as In Progress or Done.",
         {"issue_key": "e.g. PROJ-123", "transition": "Target status"}),
        ("add_worklog", "Log time spent working on a Jira issue.", {"issue_key": "e.g. PROJ-123", "time_spent": "e.g. 2h 30m"}),
        ("assign_issue", "Assign a Jira issue to a user.", {"issue_key": "e.g. PROJ-123", "assignee": "Account id"}),
        ("list_sprints", "List the active and future sprints of a Jira board.", {"board_id": "Board id"})]),
    ("linear", "Linear", ("issue", "issues"), "team", ["tracker"], [
        ("create_cycle", "Create a new cycle (sprint) for a Linear team with start and end dates.", {"team_id": "Team", "starts_at": "Start date", "ends_at": "End date"}),
        ("set_priority", "Set the priority of a Linear issue from urgent to low.", {"issue_id": "Issue", "priority": "0-4"}),
        ("add_label", "Attach a label to a Linear issue.", {"issue_id": "Issue", "label": "Label name"}),
        ("archive_project", "Archive a finished Linear project.", {"project_id": "Project"})]),
    ("slack", "Slack", ("message", "messages"), "channel", ["chat"], [
        ("post_message", "Post a message to a Slack channel or thread, with optional blocks.",
         {"channel": "Channel id", "text": "Message text", "thread_ts": "Reply in this thread"}),
        ("add_reaction", "Add an emoji reaction to a Slack message.", {"channel": "Channel id", "ts": "Message timestamp", "emoji": "Emoji name"}),
        ("set_status", "Set the user's Slack status text, emoji and expiry.", {"text": "Status text", "emoji": "Emoji", "expires": "Unix time"}),
        ("invite_to_channel", "Invite users to a Slack channel.", {"channel": "Channel id", "users": "User ids"})]),
    ("discord", "Discord", ("message", "messages"), "server", ["chat"], [
        ("create_thread", "Start a thread from a Discord message.", {"channel_id": "Channel", "message_id": "Message", "name": "Thread name"}),
        ("ban_member", "Ban a member from a Discord server, optionally deleting their recent messages.", {"guild_id": "Server", "user_id": "User", "reason": "Audit reason"}),
        ("pin_message", "Pin a message in a Discord channel.", {"channel_id": "Channel", "message_id": "Message"}),
        ("create_invite", "Create an invite link to a Discord channel with an expiry and max uses.", {"channel_id": "Channel", "max_age": "Seconds", "max_uses": "Uses"})]),
    ("teams", "Microsoft Teams", ("chat message", "chat messages"), "team", ["chat"], [
        ("schedule_meeting", "Schedule a Teams online meeting and return its join link.", {"subject": "Title", "start": "Start time", "end": "End time", "attendees": "Emails"}),
        ("send_adaptive_card", "Send an adaptive card to a Teams channel.", {"channel": "Channel", "card": "Card JSON"}),
        ("list_members", "List the members of a team and their roles.", {"team_id": "Team"}),
        ("create_channel", "Create a standard or private channel in a team.", {"team_id": "Team", "name": "Channel name", "private": "Private channel"})]),
    ("gmail", "Gmail", ("email", "emails"), "mailbox", ["email"], [
        ("send_email", "Send an email with subject, body, cc and attachments from the user's Gmail account.",
         {"to": "Recipients", "subject": "Subject line", "body": "Plain text or HTML", "attachments": "Files"}),
        ("create_draft", "Save an email as a draft without sending it.", {"to": "Recipients", "subject": "Subject", "body": "Body"}),
        ("add_label", "Apply a Gmail label to messages.", {"message_ids": "Messages", "label": "Label name"}),
        ("create_filter", "Create a Gmail filter that labels, archives or forwards matching incoming mail.", {"from": "Sender", "has_words": "Words", "action": "label, archive or forward"})]),
    ("outlook", "Outlook", ("mail message", "mail messages"), "folder", ["email"], [
        ("set_auto_reply", "Turn on an out-of-office automatic reply with a message and date range.", {"message": "Reply text", "start": "From", "end": "Until"}),
        ("move_message", "Move an Outlook message to another folder.", {"message_id": "Message", "folder": "Target folder"}),
        ("flag_message", "Flag an Outlook message for follow-up with a due date.", {"message_id": "Message", "due": "Due date"}),
        ("list_rules", "List the inbox rules of the mailbox.", {})]),
    ("gcal", "Google Calendar", ("event", "events"), "calendar", ["calendar"], [
        ("find_free_slots", "Find time slots when all the given people are free within a date range.",
         {"attendees": "Emails", "start": "Range start", "end": "Range end", "duration_minutes": "Length"}),
        ("respond_to_invite", "Accept, decline or tentatively accept a calendar invitation.", {"event_id": "Event", "response": "accepted, declined, tentative"}),
        ("add_reminder", "Add a popup or email reminder before an event.", {"event_id": "Event", "minutes_before": "Minutes"}),
        ("share_calendar", "Share a calendar with someone with read or edit rights.", {"calendar_id": "Calendar", "email": "Person", "role": "reader or writer"})]),
    ("zoom", "Zoom", ("meeting", "meetings"), "account", ["video"], [
        ("get_recording", "Get the cloud recording files and transcript of a past Zoom meeting.", {"meeting_id": "Meeting"}),
        ("add_registrant", "Register an attendee for a Zoom webinar.", {"webinar_id": "Webinar", "email": "Attendee", "name": "Name"}),
        ("end_meeting", "End a Zoom meeting that is in progress for everyone.", {"meeting_id": "Meeting"}),
        ("list_participants", "List who joined a past Zoom meeting and for how long.", {"meeting_id": "Meeting"})]),
    ("stripe", "Stripe", ("charge", "charges"), "account", ["payments"], [
        ("refund_charge", "Refund a Stripe charge fully or partially, with a reason.", {"charge_id": "Charge", "amount": "Cents; omit for full", "reason": "duplicate, fraudulent, requested_by_customer"}),
        ("create_checkout_session", "Create a Stripe Checkout session and return the hosted payment page URL.", {"line_items": "Prices and quantities", "success_url": "Redirect", "mode": "payment or subscription"}),
        ("cancel_subscription", "Cancel a customer's subscription now or at the end of the billing period.", {"subscription_id": "Subscription", "at_period_end": "Wait until period end"}),
        ("create_invoice", "Create and finalize an invoice for a customer.", {"customer_id": "Customer", "items": "Invoice items", "due_days": "Days until due"})]),
    ("paypal", "PayPal", ("payment", "payments"), "account", ["payments"], [
        ("create_payout", "Send money to one or more PayPal recipients by email.", {"recipients": "Emails and amounts", "currency": "ISO code"}),
        ("capture_order", "Capture an approved PayPal order to collect the funds.", {"order_id": "Order"}),
        ("open_dispute", "List or respond to PayPal buyer disputes and chargebacks.", {"dispute_id": "Dispute", "message": "Response"}),
        ("get_balance", "Get the PayPal account balance in each currency.", {})]),
    ("shopify", "Shopify", ("product", "products"), "store", ["commerce"], [
        ("adjust_inventory", "Adjust the stock level of a product variant at a location.", {"variant_id": "Variant", "location_id": "Warehouse", "delta": "Change in units"}),
        ("fulfill_order", "Mark a Shopify order as fulfilled with a tracking number.", {"order_id": "Order", "tracking_number": "Carrier tracking", "carrier": "Carrier"}),
        ("create_discount_code", "Create a percentage or fixed-amount discount code.", {"code": "Code", "value": "Amount", "type": "percentage or fixed"}),
        ("list_abandoned_checkouts", "List checkouts customers started but did not complete.", {"since": "Date"})]),
    ("salesforce", "Salesforce", ("lead", "leads"), "org", ["crm"], [
        ("convert_lead", "Convert a qualified lead into an account, contact and opportunity.", {"lead_id": "Lead", "opportunity_name": "Name"}),
        ("run_soql", "Run a SOQL query against Salesforce objects.", {"query": "SOQL text"}),
        ("update_opportunity_stage", "Move an opportunity to another sales stage with a close date.", {"opportunity_id": "Opportunity", "stage": "Stage", "close_date": "Date"}),
        ("log_call", "Log a call activity on a contact or account.", {"who_id": "Contact", "subject": "Subject", "notes": "Notes"})]),
    ("hubspot", "HubSpot", ("contact", "contacts"), "portal", ["crm", "marketing"], [
        ("enroll_in_sequence", "Enroll a contact in a sales email sequence.", {"contact_id": "Contact", "sequence_id": "Sequence"}),
        ("create_deal", "Create a deal in a pipeline and associate it with contacts.", {"name": "Deal name", "amount": "Amount", "pipeline": "Pipeline"}),
        ("add_note", "Add a note to a contact's timeline.", {"contact_id": "Contact", "body": "Note"}),
        ("list_form_submissions", "List the submissions of a marketing form.", {"form_id": "Form"})]),
    ("zendesk", "Zendesk", ("support ticket", "support tickets"), "help center", ["support"], [
        ("add_comment", "Reply to a Zendesk ticket publicly or add an internal note.", {"ticket_id": "Ticket", "body": "Text", "public": "Visible to requester"}),
        ("merge_tickets", "Merge duplicate Zendesk tickets into one.", {"target_id": "Ticket to keep", "source_ids": "Duplicates"}),
        ("apply_macro", "Apply a macro to a ticket to fill in a standard response.", {"ticket_id": "Ticket", "macro_id": "Macro"}),
        ("get_satisfaction_ratings", "Get customer satisfaction (CSAT) ratings for solved tickets.", {"since": "Date"})]),
    ("notion", "Notion", ("page", "pages"), "workspace", ["docs"], [
        ("query_database", "Query a Notion database with filters and sorts.", {"database_id": "Database", "filter": "Filter", "sorts": "Sorts"}),
        ("append_blocks", "Append paragraphs, to-dos or headings to the end of a Notion page.", {"page_id": "Page", "blocks": "Blocks"}),
        ("add_comment", "Comment on a Notion page or discussion.", {"page_id": "Page", "text": "Comment"}),
        ("duplicate_page", "Duplicate a Notion page with its content.", {"page_id": "Page"})]),
    ("confluence", "Confluence", ("wiki page", "wiki pages"), "space", ["docs"], [
        ("export_pdf", "Export a Confluence page to PDF.", {"page_id": "Page"}),
        ("add_attachment", "Attach a file to a Confluence page.", {"page_id": "Page", "file": "File"}),
        ("get_page_history", "List the versions of a Confluence page with their authors.", {"page_id": "Page"}),
        ("watch_page", "Watch a page to be notified of its changes.", {"page_id": "Page"})]),
    ("gdrive", "Google Drive", ("file", "files"), "drive", ["files"], [
        ("share_file", "Share a Drive file with a person or make it available to anyone with the link.", {"file_id": "File", "email": "Person", "role": "reader, commenter, writer"}),
        ("upload_file", "Upload a local file into a Drive folder.", {"name": "File name", "folder_id": "Folder", "content": "Bytes"}),
        ("export_google_doc", "Export a Google Doc, Sheet or Slides file as PDF, DOCX or CSV.", {"file_id": "File", "mime_type": "Target format"}),
        ("list_revisions", "List the revisions of a Drive file.", {"file_id": "File"})]),
    ("dropbox", "Dropbox", ("file", "files"), "folder", ["files"], [
        ("create_shared_link", "Create a shared link to a Dropbox file or folder.", {"path": "Path", "expires": "Expiry"}),
        ("restore_file", "Restore a Dropbox file to an earlier revision.", {"path": "Path", "rev": "Revision"}),
        ("get_space_usage", "Get used and allocated storage space of the Dropbox account.", {}),
        ("move_file", "Move or rename a file or folder in Dropbox.", {"from_path": "From", "to_path": "To"})]),
    ("s3", "Amazon S3", ("object", "objects"), "bucket", ["cloud", "files"], [
        ("presign_url", "Create a presigned URL to download or upload an S3 object for a limited time.", {"bucket": "Bucket", "key": "Object key", "expires_in": "Seconds"}),
        ("set_lifecycle", "Set lifecycle rules that expire or archive objects after some days.", {"bucket": "Bucket", "rules": "Rules"}),
        ("copy_object", "Copy an S3 object to another key or bucket.", {"source": "Source", "destination": "Destination"}),
        ("get_bucket_policy", "Get the access policy of a bucket.", {"bucket": "Bucket"})]),
    ("ec2", "Amazon EC2", ("instance", "instances"), "region", ["cloud"], [
        ("start_instance", "Start a stopped EC2 virtual machine.", {"instance_id": "Instance"}),
        ("stop_instance", "Stop a running EC2 virtual machine.", {"instance_id": "Instance", "force": "Force"}),
        ("create_snapshot", "Snapshot an EBS volume for backup.", {"volume_id": "Volume", "description": "Description"}),
        ("authorize_ingress", "Open a port in a security group to a CIDR range.", {"group_id": "Security group", "port": "Port", "cidr": "CIDR"})]),
    ("k8s", "Kubernetes", ("pod", "pods"), "namespace", ["cloud", "ops"], [
        ("scale_deployment", "Scale a Kubernetes deployment to a number of replicas.", {"namespace": "Namespace", "deployment": "Deployment", "replicas": "Replicas"}),
        ("get_pod_logs", "Fetch the container logs of a pod, optionally the previous crashed container.", {"namespace": "Namespace", "pod": "Pod", "previous": "Previous container", "tail_lines": "Lines"}),
        ("rollout_restart", "Restart a deployment's pods with a rolling update.", {"namespace": "Namespace", "deployment": "Deployment"}),
        ("apply_manifest", "Apply a YAML manifest to the cluster.", {"manifest": "YAML"})]),
    ("docker", "Docker Hub", ("image", "images"), "registry", ["ops"], [
        ("list_image_tags", "List the tags of a container image repository.", {"repository": "Repository"}),
        ("scan_image", "Scan a container image for known vulnerabilities (CVEs).", {"image": "Image reference"}),
        ("create_webhook", "Call a URL when a new image is pushed.", {"repository": "Repository", "url": "Webhook URL"}),
        ("get_pull_stats", "Get how many times an image was pulled.", {"repository": "Repository"})]),
    ("datadog", "Datadog", ("monitor", "monitors"), "organization", ["observability"], [
        ("mute_monitor", "Mute a monitor's alerts until a given time.", {"monitor_id": "Monitor", "end": "Until"}),
        ("query_metrics", "Query time series of a metric over a time range.", {"query": "Metric query", "from": "Start", "to": "End"}),
        ("search_logs", "Search log events with a query over a time range.", {"query": "Log query", "from": "Start", "to": "End"}),
        ("create_dashboard", "Create a dashboard with widgets.", {"title": "Title", "widgets": "Widgets"})]),
    ("pagerduty", "PagerDuty", ("incident", "incidents"), "service", ["observability", "ops"], [
        ("acknowledge_incident", "Acknowledge an incident so it stops escalating.", {"incident_id": "Incident"}),
        ("get_oncall", "Get who is on call now for an escalation policy or schedule.", {"schedule_id": "Schedule"}),
        ("trigger_incident", "Trigger a new incident on a service with a summary and severity.", {"service_id": "Service", "summary": "Summary", "severity": "critical, error, warning, info"}),
        ("add_override", "Add an on-call override shift to a schedule.", {"schedule_id": "Schedule", "user_id": "User", "start": "Start", "end": "End"})]),
    ("sentry", "Sentry", ("error event", "error events"), "project", ["observability"], [
        ("resolve_issue", "Mark a Sentry issue as resolved, optionally in the next release.", {"issue_id": "Issue", "in_next_release": "Next release"}),
        ("get_stacktrace", "Get the latest event of an issue with its stack trace and breadcrumbs.", {"issue_id": "Issue"}),
        ("list_releases", "List releases with crash-free session rates.", {"project": "Project"}),
        ("ignore_issue", "Ignore an issue until it happens again N times.", {"issue_id": "Issue", "count": "Occurrences"})]),
    ("postgres", "PostgreSQL", ("table row", "table rows"), "database", ["database"], [
        ("run_sql", "Run a read-only SQL query and return the rows.", {"sql": "SELECT statement", "params": "Bind parameters"}),
        ("explain_query", "Show the query plan of a SQL statement with EXPLAIN ANALYZE.", {"sql": "Statement"}),
        ("list_tables", "List the tables of a schema with their row counts and sizes.", {"schema": "Schema"}),
        ("describe_table", "Describe the columns, types, indexes and constraints of a table.", {"table": "Table"})]),
    ("mongodb", "MongoDB", ("document", "documents"), "collection", ["database"], [
        ("aggregate", "Run an aggregation pipeline on a collection.", {"collection": "Collection", "pipeline": "Stages"}),
        ("create_index", "Create an index on fields of a collection.", {"collection": "Collection", "keys": "Fields"}),
        ("count_documents", "Count documents that match a filter.", {"collection": "Collection", "filter": "Filter"}),
        ("bulk_write", "Insert, update and delete many documents in one call.", {"collection": "Collection", "operations": "Operations"})]),
    ("redis", "Redis", ("key", "keys"), "database", ["database", "cache"], [
        ("set_with_ttl", "Set a key to a value with an expiry in seconds.", {"key": "Key", "value": "Value", "ttl": "Seconds"}),
        ("publish", "Publish a message to a Redis pub/sub channel.", {"channel": "Channel", "message": "Message"}),
        ("flush_db", "Remove all keys of the current database.", {}),
        ("get_memory_usage", "Report memory used by the server and the biggest keys.", {})]),
    ("bigquery", "BigQuery", ("dataset table", "dataset tables"), "project", ["database", "analytics"], [
        ("run_query", "Run a SQL query on BigQuery and return the result rows.", {"sql": "SQL", "dry_run": "Only estimate cost"}),
        ("load_csv", "Load a CSV file from Cloud Storage into a table.", {"uri": "gs:// path", "table": "Table"}),
        ("estimate_cost", "Estimate how many bytes a query would scan.", {"sql": "SQL"}),
        ("export_table", "Export a table to Cloud Storage as CSV or Parquet.", {"table": "Table", "destination": "gs:// path"})]),
    ("openweather", "OpenWeather", ("weather station", "weather stations"), "region", ["weather"], [
        ("current_weather", "Get the current temperature, wind, humidity and conditions for a city or coordinates.", {"city": "City name", "lat": "Latitude", "lon": "Longitude", "units": "metric or imperial"}),
        ("forecast_5day", "Get a 5-day forecast in 3-hour steps for a location.", {"city": "City", "units": "metric or imperial"}),
        ("air_quality", "Get the air quality index and pollutant levels (PM2.5, ozone) for a location.", {"lat": "Latitude", "lon": "Longitude"}),
        ("weather_alerts", "Get active severe weather warnings issued for an area.", {"lat": "Latitude", "lon": "Longitude"})]),
    ("gmaps", "Google Maps", ("place", "places"), "map", ["maps", "travel"], [
        ("directions", "Get driving, walking, cycling or transit directions between two addresses with travel time.", {"origin": "From", "destination": "To", "mode": "driving, walking, bicycling, transit"}),
        ("geocode", "Convert a street address to latitude and longitude.", {"address": "Address"}),
        ("nearby_search", "Find places such as restaurants or gas stations near a location.", {"location": "lat,lng", "radius": "Meters", "type": "Place type"}),
        ("distance_matrix", "Compute travel distances and times between many origins and destinations.", {"origins": "Origins", "destinations": "Destinations"})]),
    ("flights", "Skyscanner", ("flight offer", "flight offers"), "market", ["travel"], [
        ("search_flights", "Search flights between two airports on a date with prices and airlines.", {"from_airport": "IATA code", "to_airport": "IATA code", "date": "Departure date", "passengers": "Count"}),
        ("price_calendar", "Show the cheapest fare for each day of a month on a route.", {"from_airport": "IATA", "to_airport": "IATA", "month": "YYYY-MM"}),
        ("flight_status", "Get the live status, gate and delay of a flight by its number.", {"flight_number": "e.g. LH400", "date": "Date"}),
        ("airport_info", "Get an airport's name, city, timezone and terminals from its code.", {"code": "IATA code"})]),
    ("booking", "Booking.com", ("hotel reservation", "hotel reservations"), "property", ["travel"], [
        ("search_hotels", "Search hotels in a city for check-in and check-out dates with prices and ratings.", {"city": "City", "checkin": "Date", "checkout": "Date", "guests": "Guests"}),
        ("cancel_reservation", "Cancel a hotel reservation and report any cancellation fee.", {"reservation_id": "Reservation"}),
        ("get_reviews", "Get guest reviews and scores of a property.", {"property_id": "Property"}),
        ("check_availability", "Check which room types are free for given dates.", {"property_id": "Property", "checkin": "Date", "checkout": "Date"})]),
    ("translate", "DeepL", ("translation", "translations"), "account", ["language"], [
        ("translate_text", "Translate text into another language, detecting the source language.", {"text": "Text", "target_lang": "e.g. DE, ZH", "formality": "more or less"}),
        ("translate_document", "Translate a whole document file (DOCX, PDF, PPTX) keeping its layout.", {"file": "File", "target_lang": "Language"}),
        ("detect_language", "Detect which language a text is written in.", {"text": "Text"}),
        ("create_glossary", "Create a glossary of fixed term translations.", {"name": "Name", "entries": "Source and target terms"})]),
    ("openai", "OpenAI", ("completion", "completions"), "organization", ["ai"], [
        ("generate_image", "Generate an image from a text prompt.", {"prompt": "Description", "size": "e.g. 1024x1024"}),
        ("transcribe_audio", "Transcribe speech in an audio file to text.", {"file": "Audio file", "language": "Language"}),
        ("create_embedding", "Create vector embeddings for texts.", {"input": "Texts", "model": "Model"}),
        ("moderate_text", "Check whether text contains hate, violence or self-harm content.", {"input": "Text"})]),
    ("twilio", "Twilio", ("SMS message", "SMS messages"), "account", ["telephony"], [
        ("send_sms", "Send an SMS text message to a phone number.", {"to": "E.164 number", "body": "Text", "from": "Sender"}),
        ("make_call", "Place an outbound voice call that plays a message or TwiML.", {"to": "Number", "twiml": "Instructions"}),
        ("lookup_number", "Look up a phone number's carrier, line type and caller name.", {"number": "E.164 number"}),
        ("send_verification_code", "Send a one-time verification code by SMS or voice and check it.", {"to": "Number", "channel": "sms or call"})]),
    ("sendgrid", "SendGrid", ("email campaign", "email campaigns"), "account", ["email", "marketing"], [
        ("send_transactional", "Send a templated transactional email with dynamic data.", {"to": "Recipient", "template_id": "Template", "data": "Variables"}),
        ("add_to_list", "Add contacts to a marketing list.", {"list_id": "List", "emails": "Emails"}),
        ("get_bounces", "List email addresses that bounced.", {"since": "Date"}),
        ("schedule_campaign", "Schedule a marketing email campaign for later.", {"campaign_id": "Campaign", "send_at": "Time"})]),
    ("mailchimp", "Mailchimp", ("audience member", "audience members"), "audience", ["marketing"], [
        ("unsubscribe_member", "Unsubscribe an email address from an audience.", {"audience_id": "Audience", "email": "Email"}),
        ("campaign_report", "Get open, click and unsubscribe rates of a sent campaign.", {"campaign_id": "Campaign"}),
        ("create_segment", "Create a segment of an audience by conditions.", {"audience_id": "Audience", "conditions": "Conditions"}),
        ("tag_member", "Add tags to an audience member.", {"audience_id": "Audience", "email": "Email", "tags": "Tags"})]),
    ("spotify", "Spotify", ("playlist", "playlists"), "library", ["media"], [
        ("play_track", "Start playing a song, album or playlist on the user's active device.", {"uri": "Spotify URI", "device_id": "Device"}),
        ("add_to_playlist", "Add tracks to a playlist.", {"playlist_id": "Playlist", "uris": "Track URIs"}),
        ("get_recommendations", "Recommend tracks similar to seed artists, tracks or genres.", {"seed_artists": "Artists", "seed_genres": "Genres"}),
        ("skip_track", "Skip to the next track in the queue.", {})]),
    ("youtube", "YouTube", ("video", "videos"), "channel", ["media"], [
        ("upload_video", "Upload a video with title, description and privacy status.", {"file": "Video", "title": "Title", "privacy": "public, unlisted, private"}),
        ("get_captions", "Download the captions (subtitles) track of a video.", {"video_id": "Video", "language": "Language"}),
        ("get_video_stats", "Get view, like and comment counts of a video.", {"video_id": "Video"}),
        ("reply_to_comment", "Reply to a comment on a video.", {"comment_id": "Comment", "text": "Reply"})]),
    ("figma", "Figma", ("design file", "design files"), "team", ["design"], [
        ("export_frames", "Export frames or components as PNG, SVG or PDF images.", {"file_key": "File", "node_ids": "Frames", "format": "png, svg, pdf"}),
        ("get_comments", "List the comments left on a design file.", {"file_key": "File"}),
        ("list_components", "List the published components of a team library.", {"team_id": "Team"}),
        ("get_styles", "Get the color and text styles of a design file.", {"file_key": "File"})]),
    ("sheets", "Google Sheets", ("spreadsheet", "spreadsheets"), "drive", ["office", "analytics"], [
        ("append_rows", "Append rows of values to the end of a sheet.", {"spreadsheet_id": "Spreadsheet", "range": "Sheet name", "values": "Rows"}),
        ("read_range", "Read the cell values of a range such as A1:D20.", {"spreadsheet_id": "Spreadsheet", "range": "A1 range"}),
        ("add_chart", "Add a chart built from a range to a sheet.", {"spreadsheet_id": "Spreadsheet", "range": "Data", "type": "bar, line, pie"}),
        ("format_cells", "Format cells: bold, colors, number format.", {"spreadsheet_id": "Spreadsheet", "range": "Range", "format": "Format"})]),
    ("airtable", "Airtable", ("record", "records"), "base", ["database", "office"], [
        ("filter_records", "Filter records with a formula.", {"base_id": "Base", "table": "Table", "formula": "Formula"}),
        ("attach_file", "Attach a file to a record's attachment field.", {"base_id": "Base", "record_id": "Record", "url": "File URL"}),
        ("list_views", "List the views of a table.", {"base_id": "Base", "table": "Table"}),
        ("upsert_records", "Create or update records matched on a field.", {"base_id": "Base", "table": "Table", "records": "Records", "match_on": "Field"})]),
    ("quickbooks", "QuickBooks", ("expense", "expenses"), "company", ["accounting"], [
        ("profit_and_loss", "Get the profit and loss report for a period.", {"start": "From", "end": "To"}),
        ("record_payment", "Record a customer payment against an invoice.", {"invoice_id": "Invoice", "amount": "Amount"}),
        ("create_bill", "Enter a vendor bill to pay later.", {"vendor_id": "Vendor", "amount": "Amount", "due": "Due date"}),
        ("reconcile_account", "Reconcile a bank account against a statement.", {"account_id": "Account", "statement_balance": "Balance"})]),
    ("workday", "Workday", ("employee", "employees"), "tenant", ["hr"], [
        ("request_time_off", "Submit a vacation or sick leave request for dates.", {"worker_id": "Worker", "type": "vacation, sick", "start": "From", "end": "To"}),
        ("get_org_chart", "Get the manager and direct reports of an employee.", {"worker_id": "Worker"}),
        ("get_payslip", "Get an employee's latest payslip.", {"worker_id": "Worker"}),
        ("approve_expense_report", "Approve or reject a submitted expense report.", {"report_id": "Report", "decision": "approve or reject"})]),
    ("news", "NewsAPI", ("news article", "news articles"), "source", ["news"], [
        ("top_headlines", "Get today's top headlines by country and category.", {"country": "Country", "category": "business, sports, technology"}),
        ("search_everything", "Search news articles by keyword over a date range.", {"q": "Keywords", "from": "From", "to": "To"}),
        ("list_sources", "List the news publishers available.", {"language": "Language"}),
        ("summarize_article", "Summarize a news article from its URL.", {"url": "Article URL"})]),
    ("finance", "Alpha Vantage", ("stock quote", "stock quotes"), "exchange", ["finance"], [
        ("stock_price", "Get the latest share price and daily change of a stock ticker.", {"symbol": "Ticker"}),
        ("fx_rate", "Get the exchange rate between two currencies.", {"from_currency": "From", "to_currency": "To"}),
        ("company_earnings", "Get a company's quarterly earnings and EPS surprises.", {"symbol": "Ticker"}),
        ("crypto_price", "Get the price of a cryptocurrency such as Bitcoin in a fiat currency.", {"symbol": "e.g. BTC", "market": "e.g. USD"})]),
]

CRUD = [
    ("list_{plural_id}", "List {plural} in a {container} on {display}, newest first, with paging.",
     {"{container_id}_id": "The {container}", "page": "Page number", "per_page": "Items per page"}),
    ("get_{single_id}", "Get one {single} from {display} by its id, with all its fields.", {"id": "The {single} id"}),
    ("create_{single_id}", "Create a new {single} in a {container} on {display}.",
     {"{container_id}_id": "The {container}", "fields": "Field values of the new {single}"}),
    ("update_{single_id}", "Update the fields of an existing {display} {single}.", {"id": "The {single} id", "fields": "Fields to change"}),
    ("delete_{single_id}", "Delete a {single} from {display} permanently.", {"id": "The {single} id"}),
    ("search_{plural_id}", "Search {display} {plural} by keywords and filters.", {"query": "Keywords", "filters": "Field filters"}),
]


def _ident(text: str) -> str:
    return text.lower().replace(" ", "_").replace("/", "_")


def _schema(props: dict[str, str]) -> dict:
    return {"type": "object", "properties": {k: {"type": "string", "description": v} for k, v in props.items()},
            "required": list(props)[:1]}


def tools() -> list[dict]:
    out = []
    for key, display, (single, plural), container, tags, specials in SERVICES:
        names = {"single": single, "plural": plural, "container": container, "display": display,
                 "single_id": _ident(single), "plural_id": _ident(plural), "container_id": _ident(container)}
        for op, desc, props in CRUD:
            out.append({"name": f"{key}_{op.format(**names)}", "description": desc.format(**names),
                        "endpoint": f"https://api.{key}.example.com/v1/{names['plural_id']}",
                        "auth_type": "oauth2", "tags": tags,
                        "input_schema": _schema({k.format(**names): v.format(**names) for k, v in props.items()}),
                        "output_schema": {"type": "object"}})
        for op, desc, props in specials:
            out.append({"name": f"{key}_{op}", "description": desc,
                        "endpoint": f"https://api.{key}.example.com/v1/{op.replace('_', '-')}",
                        "auth_type": "api_key" if key in ("openweather", "finance", "news", "translate") else "oauth2",
                        "tags": tags, "input_schema": _schema(props), "output_schema": {"type": "object"}})
    return out


def main() -> None:
    catalogue = tools()
    names = [t["name"] for t in catalogue]
    assert len(names) == len(set(names)) == 500, len(names)
    DATA.mkdir(exist_ok=True)
    with open(DATA / "tools.jsonl", "w", encoding="utf-8") as fh:
        for t in catalogue:
            fh.write(json.dumps(t, ensure_ascii=False) + "\n")
    queries = json.loads((DATA / "tool_queries.json").read_text(encoding="utf-8"))
    missing = [q["tool"] for q in queries if q["tool"] not in set(names)]
    assert not missing, missing
    print(f"{len(catalogue)} tools in {DATA / 'tools.jsonl'}; {len(queries)} judged queries")


if __name__ == "__main__":
    main()
